/* Drives a profiler plugin through the NCCL 2.28.9 model (nccl_sim.c), as an application's NCCL calls would.
 *
 *   driver PLUGIN|none VERSION [inline]    VERSION: 5 (NCCL 2.28) or 6 (NCCL 2.29+); inline: kernel-channel
 *                                          events on the calling thread (the benchmark), else on a proxy thread
 * Commands, one a line on stdin; each answers {"done": CMD, "mask": NCCL's mask} on stdout:
 *   init HASH RANK NRANKS NAME   ncclCommInitRank of communicator #k (k counts from 0)
 *   single K                     ncclAllReduce(count 1024) on communicator K: an implicit group
 *   group2 K                     ncclGroupStart; ncclAllReduce(1024); ncclAllReduce(2048); ncclGroupEnd
 *   p2p K                        ncclGroupStart; ncclSend(512, peer 1); ncclRecv(512, peer 1); ncclGroupEnd
 *   finalize K                   ncclCommDestroy (the plugin's finalize)
 *   ras MASK                     NCCL 2.32's RAS override: MASK stored as NCCL's mask from outside the plugin
 *   bench N ROUNDS               ROUNDS x N implicit-group all-reduces on communicator 0: ns per call per round
 * With tracing (not while benchmarking), every plugin call is a JSON line: {"ev": "start"|"stop"|"record", ...}.
 * NCCL's log lines (the logger given to init) go to stderr as "NCCLLOG <level> <text>". */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_sim.h"

#define MAX_COMMS 8

static pthread_mutex_t g_out = PTHREAD_MUTEX_INITIALIZER;
static int g_tracing = 1;
static struct sim_comm g_comms[MAX_COMMS];
static char g_names[MAX_COMMS][64];
static int g_ncomms;

static unsigned long long u(const void *p)
{
    return (unsigned long long)(uintptr_t)p;
}

static void out(const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&g_out);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
    pthread_mutex_unlock(&g_out);
}

static void trace_start(const ncclProfilerEventDescr_v6_t *d, void *ctx, void *h, int proxy)
{
    if (!g_tracing)
        return;
    char extra[192] = "";
    if (d->type == ncclProfileColl)
        snprintf(extra, sizeof extra, ", \"group\": %llu, \"seq\": %llu, \"count\": %zu, \"send\": %llu, \"recv\": %llu",
                 u(d->coll.parentGroup), (unsigned long long)d->coll.seqNumber, d->coll.count, u(d->coll.sendBuff),
                 u(d->coll.recvBuff));
    else if (d->type == ncclProfileP2p)
        snprintf(extra, sizeof extra, ", \"group\": %llu, \"func\": \"%s\", \"count\": %zu, \"peer\": %d, \"buff\": %llu",
                 u(d->p2p.parentGroup), d->p2p.func, d->p2p.count, d->p2p.peer, u(d->p2p.buff));
    else if (d->type == ncclProfileKernelCh)
        snprintf(extra, sizeof extra, ", \"channel\": %d, \"ptimer\": %llu", d->kernelCh.channelId,
                 (unsigned long long)d->kernelCh.pTimer);
    out("{\"ev\": \"start\", \"type\": %llu, \"h\": %llu, \"parent\": %llu, \"ctx\": %llu, \"proxy\": %d%s}",
        (unsigned long long)d->type, u(h), u(d->parentObj), u(ctx), proxy, extra);
}

static void trace_stop(void *h, int proxy)
{
    if (g_tracing)
        out("{\"ev\": \"stop\", \"h\": %llu, \"proxy\": %d}", u(h), proxy);
}

static void trace_record(void *h, int state, const ncclProfilerEventStateArgs_v5_t *a, int proxy)
{
    if (g_tracing)
        out("{\"ev\": \"record\", \"h\": %llu, \"state\": %d, \"ptimer\": %llu, \"proxy\": %d}", u(h), state,
            state == ncclProfilerKernelChStop ? (unsigned long long)a->kernelCh.pTimer : 0ull, proxy);
}

static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    (void)flags, (void)file, (void)line;
    fprintf(stderr, "NCCLLOG %d ", (int)level);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void bench(long n, int rounds)
{
    char buf[1024] = "";
    size_t len = 0;
    g_tracing = 0;
    for (long i = 0; i < n / 10 + 1; i++) /* warm-up */
        sim_all_reduce(&g_comms[0], 1024);
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ns();
        for (long i = 0; i < n; i++)
            sim_all_reduce(&g_comms[0], 1024);
        double ns = (now_ns() - t0) / (double)n;
        len += snprintf(buf + len, sizeof buf - len, "%s%.2f", r ? ", " : "", ns);
    }
    g_tracing = 1;
    out("{\"bench\": [%s]}", buf);
}

static struct sim_comm *comm_arg(const char *arg)
{
    int k = arg ? atoi(arg) : 0;
    return &g_comms[k >= 0 && k < g_ncomms ? k : 0];
}

static int command(char *line)
{
    char *cmd = strtok(line, " \t\n"), *a1 = strtok(NULL, " \t\n");
    if (!cmd)
        return 1;
    if (strcmp(cmd, "init") == 0 && g_ncomms < MAX_COMMS) {
        struct sim_comm *c = &g_comms[g_ncomms];
        char *rank = strtok(NULL, " \t\n"), *nranks = strtok(NULL, " \t\n"), *name = strtok(NULL, " \t\n");
        c->commHash = strtoull(a1 ? a1 : "0", NULL, 0);
        c->rank = rank ? atoi(rank) : 0;
        c->nRanks = nranks ? atoi(nranks) : 2;
        c->nNodes = 1;
        snprintf(g_names[g_ncomms], sizeof g_names[0], "%s", name ? name : "");
        c->commName = g_names[g_ncomms];
        int rc = sim_comm_init(c);
        out("{\"ev\": \"init\", \"comm\": %d, \"ctx\": %llu, \"rc\": %d}", g_ncomms++, u(c->profilerContext), rc);
    } else if (strcmp(cmd, "single") == 0) {
        sim_all_reduce(comm_arg(a1), 1024);
    } else if (strcmp(cmd, "group2") == 0) {
        sim_group_start();
        sim_all_reduce(comm_arg(a1), 1024);
        sim_all_reduce(comm_arg(a1), 2048);
        sim_group_end();
    } else if (strcmp(cmd, "p2p") == 0) {
        sim_group_start();
        sim_send(comm_arg(a1), 512, 1);
        sim_recv(comm_arg(a1), 512, 1);
        sim_group_end();
    } else if (strcmp(cmd, "finalize") == 0) {
        sim_comm_finalize(comm_arg(a1));
        out("{\"ev\": \"finalize\", \"ctx\": %llu}", u(comm_arg(a1)->profilerContext));
    } else if (strcmp(cmd, "ras") == 0) {
        sim_ras_override((int)strtol(a1 ? a1 : "0", NULL, 0));
    } else if (strcmp(cmd, "bench") == 0) {
        char *rounds = strtok(NULL, " \t\n");
        bench(a1 ? atol(a1) : 100000, rounds ? atoi(rounds) : 5);
    } else if (strcmp(cmd, "quit") == 0) {
        return 0;
    } else {
        out("{\"error\": \"unknown command %s\"}", cmd);
        return 1;
    }
    out("{\"done\": \"%s\", \"mask\": %d}", cmd, sim_mask());
    return 1;
}

int main(int argc, char **argv)
{
    static const struct sim_hooks hooks = {trace_start, trace_stop, trace_record};
    char line[256];
    if (argc < 3) {
        fprintf(stderr, "usage: %s PLUGIN|none 5|6 [inline]\n", argv[0]);
        return 2;
    }
    const char *plugin = strcmp(argv[1], "none") == 0 ? NULL : argv[1];
    int rc = sim_load(plugin, atoi(argv[2]), &hooks, argc > 3 && strcmp(argv[3], "inline") == 0, logger);
    if (rc != 0) {
        fprintf(stderr, "driver: cannot load %s (%d)\n", argv[1], rc);
        return 1;
    }
    out("{\"ready\": %d, \"mask\": %d}", (int)getpid(), sim_mask());
    while (fgets(line, sizeof line, stdin) && command(line))
        ;
    sim_unload();
    return 0;
}
