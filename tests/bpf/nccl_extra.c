/*
 * nccl_extra: calls into a libnccl.so.2 (the stand-in or the real one) that
 * tests/support/nccl_rank.c does not make, with KNOWN arguments, for
 * tests/bpf/test_nccl_receiver.py; and a timing loop for the probe cost.
 *
 * Usage:
 *   nccl_extra LIBNCCL calls [--wait-before-load]
 *   nccl_extra LIBNCCL bench N [--wait-stdin]
 *
 * --wait-before-load: print "ready pid=P" and wait for a line on stdin BEFORE
 * dlopen, so the tracer sees the library being opened (pause_on_load path).
 * --wait-stdin: the same, after dlopen.
 *
 * calls (one line per call, "NAME rc=N [key=value]"):
 *   ncclGetUniqueId(&id)                                 prints id=<256 hex digits>
 *   ncclCommInitRankConfig(&c, 2, id, 1, NULL)
 *   ncclCommCount(c) ncclCommUserRank(c) ncclCommCuDevice(c)   (as cupy's NcclCommunicator size/rank_id/
 *                                                             device_id ask; PyTorch never does)
 *   ncclReduce(S, R, 32, ncclUint8 = 1, ncclMin = 3, root 1, c, stream 0x1234)
 *   ncclAllReduce(S, R, 16, ncclInt64 = 4, ncclProd = 1, c, stream 0x5678)
 *   ncclAlltoAll(S, R, 8, ncclFloat64 = 8, c, NULL)          (if exported)
 *   ncclAllReduce(S, R, 16, 99, ncclSum, c, NULL)            -> ncclInvalidArgument
 *   ncclGroupStart ncclGroupStart ncclSend(S, 3, ncclInt8, peer 0, c)
 *     ncclGroupEnd ncclRecv(R, 5, ncclUint32 = 3, peer 0, c) ncclGroupEnd
 *   ncclCommSplit(c, 5, 0, &sub, NULL)      (argument decoding only: this stand-in's split is not NCCL's,
 *                                            see stand_in_nccl.c; nothing is asked of the child, as
 *                                            PyTorch asks nothing: split ranks are tested on real torch in
 *                                            tests/twin)
 *   ncclAllReduce(S, R, 2, ncclFloat32, ncclSum, sub, NULL)
 *   ncclCommAbort(sub)
 *   ncclCommInitAll(all, 3, {4, 5, 6}); ncclBroadcast(S, R, 7, ncclFloat16, 2, all[i]) for i;
 *     ncclCommDestroy(all[i]) for i
 *   ncclCommInitRank(&c2, 2, id, 1)   (the same id again); ncclCommDestroy(c2)
 *   ncclCommDestroy(c)
 * bench: ncclCommInitRank(&c, 1, id, 0), then N x ncclAllReduce(S, R, 1,
 *   ncclFloat32, ncclSum, c, NULL); prints "bench calls=N ns_per_call=X".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int res_t;
typedef void *comm_t;
typedef struct { char internal[128]; } uid_t_;

static void *lib;

static void *sym(const char *name, int required)
{
    void *p = dlsym(lib, name);
    if (p == NULL && required) {
        fprintf(stderr, "nccl_extra: dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

#define FN(type, name) ((type)sym(name, 1))
typedef res_t (*get_id_f)(uid_t_ *);
typedef res_t (*init_rank_f)(comm_t *, int, uid_t_, int);
typedef res_t (*init_config_f)(comm_t *, int, uid_t_, int, void *);
typedef res_t (*init_all_f)(comm_t *, int, const int *);
typedef res_t (*query_f)(comm_t, int *);
typedef res_t (*comm_f)(comm_t);
typedef res_t (*split_f)(comm_t, int, int, comm_t *, void *);
typedef res_t (*allreduce_f)(const void *, void *, size_t, int, int, comm_t, void *);
typedef res_t (*reduce_f)(const void *, void *, size_t, int, int, int, comm_t, void *);
typedef res_t (*bcast_f)(const void *, void *, size_t, int, int, comm_t, void *);
typedef res_t (*a2a_f)(const void *, void *, size_t, int, comm_t, void *);
typedef res_t (*p2p_f)(void *, size_t, int, int, comm_t, void *);
typedef res_t (*void_f)(void);

static char sbuf[4096], rbuf[4096];

static void wait_line(void)
{
    char line[64];
    printf("ready pid=%d\n", (int)getpid());
    if (fgets(line, sizeof(line), stdin) == NULL)
        exit(1);
}

static void load(const char *path)
{
    lib = dlopen(path, RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "nccl_extra: dlopen(%s): %s\n", path, dlerror());
        exit(1);
    }
}

static void query(const char *name, comm_t c)
{
    int v = -7;
    res_t rc = FN(query_f, name)(c, &v);
    printf("%s rc=%d value=%d\n", name, rc, v);
}

static void run_calls(void)
{
    uid_t_ id;
    comm_t c = NULL, sub = NULL, c2 = NULL, all[3] = { 0 };
    int devs[3] = { 4, 5, 6 };
    allreduce_f allreduce = FN(allreduce_f, "ncclAllReduce");
    a2a_f a2a = (a2a_f)sym("ncclAlltoAll", 0);

    printf("ncclGetUniqueId rc=%d id=", FN(get_id_f, "ncclGetUniqueId")(&id));
    for (int i = 0; i < 128; i++)
        printf("%02x", (unsigned char)id.internal[i]);
    printf("\n");
    printf("ncclCommInitRankConfig rc=%d\n", FN(init_config_f, "ncclCommInitRankConfig")(&c, 2, id, 1, NULL));
    query("ncclCommCount", c);
    query("ncclCommUserRank", c);
    query("ncclCommCuDevice", c);
    printf("ncclReduce rc=%d\n", FN(reduce_f, "ncclReduce")(sbuf, rbuf, 32, 1, 3, 1, c, (void *)0x1234));
    printf("ncclAllReduce rc=%d\n", allreduce(sbuf, rbuf, 16, 4, 1, c, (void *)0x5678));
    if (a2a != NULL)
        printf("ncclAlltoAll rc=%d\n", a2a(sbuf, rbuf, 8, 8, c, NULL));
    printf("ncclAllReduce rc=%d\n", allreduce(sbuf, rbuf, 16, 99, 0, c, NULL));
    printf("ncclGroupStart rc=%d\n", FN(void_f, "ncclGroupStart")());
    printf("ncclGroupStart rc=%d\n", FN(void_f, "ncclGroupStart")());
    printf("ncclSend rc=%d\n", FN(p2p_f, "ncclSend")(sbuf, 3, 0, 0, c, NULL));
    printf("ncclGroupEnd rc=%d\n", FN(void_f, "ncclGroupEnd")());
    printf("ncclRecv rc=%d\n", FN(p2p_f, "ncclRecv")(rbuf, 5, 3, 0, c, NULL));
    printf("ncclGroupEnd rc=%d\n", FN(void_f, "ncclGroupEnd")());
    printf("ncclCommSplit rc=%d\n", FN(split_f, "ncclCommSplit")(c, 5, 0, &sub, NULL));
    printf("ncclAllReduce rc=%d\n", allreduce(sbuf, rbuf, 2, 7, 0, sub, NULL));
    printf("ncclCommAbort rc=%d\n", FN(comm_f, "ncclCommAbort")(sub));
    printf("ncclCommInitAll rc=%d\n", FN(init_all_f, "ncclCommInitAll")(all, 3, devs));
    for (int i = 0; i < 3; i++)
        printf("ncclBroadcast rc=%d\n", FN(bcast_f, "ncclBroadcast")(sbuf, rbuf, 7, 6, 2, all[i], NULL));
    for (int i = 0; i < 3; i++)
        printf("ncclCommDestroy rc=%d\n", FN(comm_f, "ncclCommDestroy")(all[i]));
    printf("ncclCommInitRank rc=%d\n", FN(init_rank_f, "ncclCommInitRank")(&c2, 2, id, 1));
    printf("ncclCommDestroy rc=%d\n", FN(comm_f, "ncclCommDestroy")(c2));
    printf("ncclCommDestroy rc=%d\n", FN(comm_f, "ncclCommDestroy")(c));
}

static void run_bench(long n)
{
    uid_t_ id;
    comm_t c = NULL;
    struct timespec t0, t1;
    allreduce_f allreduce = FN(allreduce_f, "ncclAllReduce");

    if (FN(get_id_f, "ncclGetUniqueId")(&id) != 0 || FN(init_rank_f, "ncclCommInitRank")(&c, 1, id, 0) != 0) {
        fprintf(stderr, "nccl_extra: init failed\n");
        exit(2);
    }
    for (int i = 0; i < 1000; i++)   /* warm up: page faults, first-call paths */
        allreduce(sbuf, rbuf, 1, 7, 0, c, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n; i++)
        allreduce(sbuf, rbuf, 1, 7, 0, c, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
    printf("bench calls=%ld ns_per_call=%.1f\n", n, ns / (double)n);
    FN(comm_f, "ncclCommDestroy")(c);
}

int main(int argc, char **argv)
{
    int wait_before = 0, wait_after = 0;
    long n = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3)
        goto usage;
    int bench = strcmp(argv[2], "bench") == 0;
    if (!bench && strcmp(argv[2], "calls") != 0)
        goto usage;
    int i = 3;
    if (bench) {
        if (argc < 4)
            goto usage;
        n = strtol(argv[3], NULL, 10);
        i = 4;
    }
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--wait-before-load") == 0)
            wait_before = 1;
        else if (strcmp(argv[i], "--wait-stdin") == 0)
            wait_after = 1;
        else
            goto usage;
    }
    if (wait_before)
        wait_line();
    load(argv[1]);
    if (wait_after)
        wait_line();
    if (bench)
        run_bench(n > 0 ? n : 100000);
    else
        run_calls();
    return 0;
usage:
    fprintf(stderr, "usage: nccl_extra LIBNCCL calls [--wait-before-load] | bench N [--wait-stdin]\n");
    return 1;
}
