/*
 * sched_rank: a 1-rank NCCL job (through dlopen, against the stand-in libnccl.so.2) whose
 * host-side steps between collectives follow a known pattern, for the sched receiver's
 * per-step figures (ml.step.*) on the NCCL processor's collective spans.
 *
 * Usage: sched_rank LIBNCCL
 *   dlopen + dlsym, print "ready pid=P", wait for one line on stdin, then:
 *   ncclGetUniqueId, ncclCommInitRank(&comm, 1, id, 0)
 *   ncclAllReduce #0; sleep 300 ms (the tracer starts watching this thread)
 *   ncclAllReduce #1; spin 100 ms of CPU time
 *   ncclAllReduce #2; sleep 150 ms
 *   ncclAllReduce #3; print "done spin_wall=W spin_cpu=C" (the spin's seconds of CLOCK_MONOTONIC
 *   and of this thread's CPU time: on a VM the kernel's on-CPU time, timed by sched_switch, holds
 *   the hypervisor's steal, which the thread's CPU clock leaves out)
 * Exit status: 0, or 1 on any error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef ncclResult_t (*get_id_fn)(ncclUniqueId *);
typedef ncclResult_t (*init_fn)(ncclComm_t *, int, ncclUniqueId, int);
typedef ncclResult_t (*all_reduce_fn)(const void *, void *, size_t, int, int, ncclComm_t, void *);

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

int main(int argc, char **argv)
{
    static float buf[1024];
    if (argc != 2)
        return 1;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib)
        return 1;
    get_id_fn get_id = (get_id_fn)dlsym(lib, "ncclGetUniqueId");
    init_fn init = (init_fn)dlsym(lib, "ncclCommInitRank");
    all_reduce_fn all_reduce = (all_reduce_fn)dlsym(lib, "ncclAllReduce");
    if (!get_id || !init || !all_reduce)
        return 1;
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    ncclUniqueId id;
    ncclComm_t comm;
    if (get_id(&id) != 0 || init(&comm, 1, id, 0) != 0)
        return 1;
    int rc = all_reduce(buf, buf, 1024, 7 /* float32 */, 0 /* sum */, comm, NULL);
    sleep_ms(300);
    rc |= all_reduce(buf, buf, 1024, 7, 0, comm, NULL);
    double w0 = wall_s(), c0 = cpu_s(), c1;
    while ((c1 = cpu_s()) < c0 + 0.1)
        ;
    double w1 = wall_s();
    rc |= all_reduce(buf, buf, 1024, 7, 0, comm, NULL);
    sleep_ms(150);
    rc |= all_reduce(buf, buf, 1024, 7, 0, comm, NULL);
    printf("done spin_wall=%.6f spin_cpu=%.6f\n", w1 - w0, c1 - c0);
    return rc != 0;
}
