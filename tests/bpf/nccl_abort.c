/* ncclCommAbort from another thread while a thread is blocked inside a collective on that communicator,
 * as PyTorch 2.11's watchdog does (torch/csrc/distributed/c10d: the heartbeat/watchdog thread aborts
 * the communicators of a timed-out work) and as NCCL 2.28.9 allows (src/init.cc ncclCommAbort).
 *
 * Built twice by tests/bpf/test_nccl_receiver.py:
 *   -DFAKE_LIB -shared -fPIC -> libnccl.so.2: the host API symbols the receiver probes. Its ncclAllReduce
 *   with count 0 returns at once; with count > 0 it blocks until the communicator is aborted, then returns
 *   ncclSuccess (NCCL 2.28.9's enqueue had returned before the peer died) once the program says the abort
 *   returned (ncclCommRelease, not NCCL's: it makes the order of the two returns certain). Its communicator is one static
 *   object, so a communicator made after an abort gets the same handle (NCCL's handles are reused too).
 *   otherwise -> the program: nccl_abort LIB [--wait-stdin]:
 *     ncclCommInitRank(c); ncclAllReduce(count 0)           -> seq 0
 *     thread A: ncclAllReduce(count 1) blocks                -> seq 1, returns after the abort
 *     main: ncclCommAbort(c) once A is inside, join A
 *     ncclCommInitRank(c2) (same handle); ncclAllReduce(count 0) -> seq 0 of the new communicator
 *     ncclCommDestroy(c2)
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct { char internal[128]; } uid_t_;

#ifdef FAKE_LIB
struct comm { volatile int aborted; volatile int blocked; volatile int released; };
static struct comm the_comm;

static void nap(void)
{
    struct timespec ts = { 0, 1000000 };
    nanosleep(&ts, NULL);
}

int ncclGetUniqueId(uid_t_ *id) { memset(id, 7, sizeof(*id)); return 0; }
int ncclCommInitRank(struct comm **c, int n, uid_t_ id, int r)
{
    (void)n; (void)id; (void)r;
    the_comm.aborted = the_comm.released = 0;
    *c = &the_comm;
    return 0;
}
int ncclCommInitAll(struct comm **c, int n, const int *d) { (void)c; (void)n; (void)d; return 5; }
int ncclCommDestroy(struct comm *c) { (void)c; return 0; }
int ncclCommAbort(struct comm *c) { c->aborted = 1; return 0; }
/* for the program, not NCCL's API: is a thread inside? / let it return (the abort has returned) */
int ncclCommBlocked(struct comm *c) { return c->blocked; }
int ncclCommRelease(struct comm *c) { c->released = 1; return 0; }
int ncclAllReduce(const void *s, void *r, size_t n, int t, int op, struct comm *c, void *st)
{
    (void)s; (void)r; (void)t; (void)op; (void)st;
    if (n > 0) {
        c->blocked = 1;
        while (!c->aborted || !c->released)
            nap();
        c->blocked = 0;
    }
    return 0;
}
#define UNUSED_COLL(name) int name(void) { return 0; }
UNUSED_COLL(ncclBroadcast)
UNUSED_COLL(ncclReduce)
UNUSED_COLL(ncclAllGather)
UNUSED_COLL(ncclReduceScatter)
UNUSED_COLL(ncclSend)
UNUSED_COLL(ncclRecv)
UNUSED_COLL(ncclGroupStart)
UNUSED_COLL(ncclGroupEnd)

#else
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*get_id_f)(uid_t_ *);
typedef int (*init_f)(void **, int, uid_t_, int);
typedef int (*comm_f)(void *);
typedef int (*allreduce_f)(const void *, void *, size_t, int, int, void *, void *);

static void *lib;
static void *comm;
static float buf[4];

static void *sym(const char *name)
{
    void *p = dlsym(lib, name);
    if (p == NULL) {
        fprintf(stderr, "nccl_abort: %s missing\n", name);
        exit(2);
    }
    return p;
}

static void *blocked_call(void *arg)
{
    (void)arg;
    printf("blocked ncclAllReduce rc=%d\n", ((allreduce_f)sym("ncclAllReduce"))(buf, buf, 1, 7, 0, comm, NULL));
    return NULL;
}

int main(int argc, char **argv)
{
    char line[16];
    uid_t_ id;
    pthread_t a;
    if (argc < 2)
        return 2;
    if (argc > 2 && strcmp(argv[2], "--wait-stdin") == 0) {
        printf("ready pid=%d\n", (int)getpid());
        fflush(stdout);
        if (fgets(line, sizeof(line), stdin) == NULL)
            return 2;
    }
    lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL)
        return 2;
    allreduce_f allreduce = (allreduce_f)sym("ncclAllReduce");
    ((get_id_f)sym("ncclGetUniqueId"))(&id);
    printf("ncclCommInitRank rc=%d\n", ((init_f)sym("ncclCommInitRank"))(&comm, 1, id, 0));
    printf("ncclAllReduce rc=%d\n", allreduce(buf, buf, 0, 7, 0, comm, NULL));
    if (pthread_create(&a, NULL, blocked_call, NULL) != 0)
        return 2;
    for (int i = 0; i < 10000 && !((comm_f)sym("ncclCommBlocked"))(comm); i++)
        usleep(1000);
    usleep(50000);  /* A is inside ncclAllReduce (past its entry probe) */
    printf("ncclCommAbort rc=%d\n", ((comm_f)sym("ncclCommAbort"))(comm));
    ((comm_f)sym("ncclCommRelease"))(comm);
    pthread_join(a, NULL);
    void *old = comm;
    printf("ncclCommInitRank rc=%d\n", ((init_f)sym("ncclCommInitRank"))(&comm, 1, id, 0));
    printf("same handle=%d\n", comm == old);
    printf("ncclAllReduce rc=%d\n", allreduce(buf, buf, 0, 7, 0, comm, NULL));
    printf("ncclCommDestroy rc=%d\n", ((comm_f)sym("ncclCommDestroy"))(comm));
    return 0;
}
#endif
