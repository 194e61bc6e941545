/*
 * Stand-in libnccl.so.2 for the twin, part 1: versions, errors and communicators.  Not NVIDIA's library.
 * Follows NCCL 2.28.9 (the nvidia-nccl-cu13 torch 2.11.0 pins): its nccl.h for every prototype and value,
 * its src/init.cc for communicator semantics (cited per function below).  Exports every NCCL symbol torch
 * 2.11.0 imports (otel_ebpf/twin/build.py checks that against the installed wheel), and ncclCommCuDevice.
 *
 * A communicator here is a struct in the rank's process plus a shared-memory staging area that every rank
 * of it maps (nccl_coll.c).  "Bootstrap" collectives (the split's allgather) go through the parent's area.
 *
 * Non-blocking communicators (config.blocking = 0, or NCCL_COMM_BLOCKING=0) as NCCL 2.28.9 src/init.cc and
 * src/group.cc: init sets *newcomm at once (ncclCommInitRankDev: `*newcomm = comm` with initState
 * ncclInProgress), finishes on a thread and returns ncclInProgress (ncclCommInitRankConfig returns
 * ncclCommGetAsyncError(*newcomm)); a split of a non-blocking parent returns ncclSuccess with *newcomm
 * NULL ("*newcomm should be NCCL_COMM_NULL until comm split fully complete", ncclCommInitChildComm; the
 * nonblocking group end's ncclInProgress is not returned by ncclCommSplit), the parent reports ncclInProgress
 * through ncclCommGetAsyncError until the split's thread has published *newcomm (ncclCommInitRankFunc:
 * `__atomic_store_n(job->newcomm, comm, __ATOMIC_RELEASE)`) and set the parent's result (groupLaunch:
 * ncclCommSetAsyncError(job->comm, ret)).  A comm in progress is refused by every call that needs it ready
 * (ncclCommEnsureReady: ncclInvalidArgument).
 *
 * Known differences from NCCL 2.28.9, not fixed yet (docs/twin.md lists them):
 * - ncclCommInitRankScalable ignores all ids but the first (NCCL spreads its bootstrap over nId roots).
 * - ncclCommAbort does not free the communicator (a stream's worker may still be reading it).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_twin.h"

static __thread char last_error[256];

void twin_set_last_error(const char *msg)
{
    snprintf(last_error, sizeof(last_error), "%s", msg);
}

int twin_trace_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *s = getenv("OTEL_EBPF_TWIN_TRACE");
        on = s != NULL && *s != '\0' && *s != '0';
    }
    return on;
}

/* FNV-1a; the hash only has to agree between ranks (NCCL uses its own getHash/eatHash, src/misc/utils.cc). */
uint64_t twin_hash(uint64_t h, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

/* A comm that exists, is not aborted and is ready (src/init.cc CommCheck + ncclCommEnsureReady). */
int twin_comm_ok(const struct ncclComm *c)
{
    return c != NULL && c->magic == TWIN_COMM_MAGIC && !c->aborted && c->nranks > 0
           && __atomic_load_n(&c->async_result, __ATOMIC_ACQUIRE) != ncclInProgress;
}

/* config.blocking: the caller's, default 1, NCCL_COMM_BLOCKING=0/1 overriding (src/init.cc parseCommConfig,
 * envConfigOverride); a split without a config copies the parent's (copyCommConfig). */
static int blocking_of(const ncclConfig_t *config, int inherited)
{
    const char *env = getenv("NCCL_COMM_BLOCKING");
    if (env != NULL && (strcmp(env, "0") == 0 || strcmp(env, "1") == 0))
        return env[0] == '1';
    if (config == NULL)
        return inherited;
    return config->blocking == NCCL_CONFIG_UNDEF_INT ? 1 : config->blocking != 0;
}

/* config.commName (src/init.cc parseCommConfig; a split without a config copies the parent's), owned by the comm. */
static char *name_of(const ncclConfig_t *config, const char *inherited)
{
    const char *name = inherited;
    if (config != NULL)
        name = config->size >= offsetof(ncclConfig_t, commName) + sizeof(config->commName) ? config->commName : NULL;
    return name != NULL ? strdup(name) : NULL;
}

/* `id`: NCCL's commHash and commName for the profiler (nccl_profiler.c); the comm owns id->name. */
static struct ncclComm *alloc_comm(uint64_t hash, int nranks, int rank, int device, int blocking,
                                   const struct twin_prof_comm *id)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (c != NULL)
        *c = (struct ncclComm){ .magic = TWIN_COMM_MAGIC, .hash = hash, .rank = rank, .nranks = nranks,
                                .device = device, .blocking = blocking, .async_result = ncclSuccess, .prof = *id };
    else
        free(id->name);
    return c;
}

/* The staging area, then the profiler's init (src/init.cc initTransportsRank: before the proxy thread). */
static ncclResult_t open_comm(struct ncclComm *c)
{
    ncclResult_t rc = twin_shm_open(c);
    if (rc == ncclSuccess && twin_trace_on())
        fprintf(stderr, "[twin nccl %d] comm %p hash %016llx rank %d/%d%s\n", (int)getpid(), (void *)c,
                (unsigned long long)c->hash, c->rank, c->nranks, c->blocking ? "" : " (non-blocking)");
    if (rc == ncclSuccess)
        twin_prof_init(c);
    return rc;
}

static ncclResult_t new_comm(ncclComm_t *out, uint64_t hash, int nranks, int rank, int device, int blocking,
                             const struct twin_prof_comm *id)
{
    struct ncclComm *c = alloc_comm(hash, nranks, rank, device, blocking, id);
    ncclResult_t rc;
    if (c == NULL)
        return ncclSystemError;
    if ((rc = open_comm(c)) != ncclSuccess) {
        twin_prof_comm_free(c);
        free(c);
        return rc;
    }
    *out = c;
    return ncclSuccess;
}

/* Runs fn(arg) on a detached thread: NCCL's init/split job thread (src/group.cc ncclAsyncJobMain). */
static ncclResult_t start_job(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    if (pthread_create(&t, NULL, fn, arg) != 0)
        return ncclSystemError;
    pthread_detach(t);
    return ncclSuccess;
}

static void *init_job(void *arg)
{
    struct ncclComm *c = arg;
    __atomic_store_n(&c->async_result, open_comm(c), __ATOMIC_RELEASE);
    return NULL;
}

/* The CUDA device of the calling thread, as NCCL's init records it (src/init.cc ncclCommInitRankDev). */
static int current_device(void)
{
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess ? dev : 0;
}

/* ---- versions, ids, errors ---- */

NCCL_API(ncclResult_t, ncclGetVersion, int *version)
{
    if (version == NULL)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE; /* 22809: from the real nccl.h */
    return ncclSuccess;
}

/* NCCL fills the id with the root's bootstrap address and a random magic; 128 random bytes serve the same
 * purpose here: equal on every rank (torch's store broadcasts it), distinct per communicator. */
NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId)
{
    size_t got = 0;
    int fd;
    if (uniqueId == NULL)
        return ncclInvalidArgument;
    fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ncclSystemError;
    while (got < sizeof(*uniqueId)) {
        ssize_t n = read(fd, uniqueId->internal + got, sizeof(*uniqueId) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    return got == sizeof(*uniqueId) ? ncclSuccess : ncclSystemError;
}

/* The texts of NCCL 2.28.9 src/init.cc ncclGetErrorString. */
NCCL_API(const char *, ncclGetErrorString, ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

NCCL_API(const char *, ncclGetLastError, ncclComm_t comm)
{
    (void)comm;
    return last_error;
}

/* ---- communicators (src/init.cc) ---- */

/* Root communicator: commHash = getHash(commId) (src/init.cc ncclCommInitRankFunc). */
NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
         ncclConfig_t *config)
{
    uint64_t hash = twin_hash(0xcbf29ce484222325ULL, &commId, sizeof(commId));
    int blocking = blocking_of(config, 1);
    struct twin_prof_comm id = { .hash = twin_nccl_hash(commId.internal, NCCL_UNIQUE_ID_BYTES) };
    struct ncclComm *c;
    if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    id.name = name_of(config, NULL);
    if (blocking)
        return new_comm(comm, hash, nranks, rank, current_device(), 1, &id);
    if ((c = alloc_comm(hash, nranks, rank, current_device(), 0, &id)) == NULL)
        return ncclSystemError;
    c->async_result = ncclInProgress;
    if (start_job(init_job, c) != ncclSuccess) {
        twin_prof_comm_free(c);
        free(c);
        return ncclSystemError;
    }
    *comm = c; /* published at once, in progress (ncclCommInitRankDev) */
    return __atomic_load_n(&c->async_result, __ATOMIC_ACQUIRE);
}

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return ncclCommInitRankConfig(comm, nranks, commId, rank, NULL);
}

NCCL_API(ncclResult_t, ncclCommInitRankScalable, ncclComm_t *newcomm, int nranks, int myrank, int nId,
         ncclUniqueId *commIds, ncclConfig_t *config)
{
    if (nId < 1 || commIds == NULL)
        return ncclInvalidArgument;
    return ncclCommInitRankConfig(newcomm, nranks, commIds[0], myrank, config);
}

/* One process driving ndev devices: the comms share one process, so their collectives would have to run
 * on threads; torch only calls it for its single-process multi-device mode, refused here. */
NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comm, int ndev, const int *devlist)
{
    (void)comm; (void)ndev; (void)devlist;
    twin_set_last_error("otel-ebpf twin: ncclCommInitAll (one process, many devices) is not modelled");
    return ncclInvalidUsage;
}

/* One split as NCCL's ncclCommInitRankAsyncJob holds it (src/init.cc ncclCommInitChildComm). */
struct split_job {
    struct ncclComm *parent;
    int color, key, split_count, blocking;
    ncclComm_t *newcomm;
    char *name; /* config.commName at the call, taken by the child */
};

/*
 * As NCCL 2.28.9 src/init.cc commGetSplitInfo: an allgather of (color, key) over the parent, then the
 * child's ranks are the parent ranks of the same color, ordered by key and, for equal keys, by parent rank
 * (the insertion loop there compares `key <=`, keeping parent order for ties).  NCCL_SPLIT_NOCOLOR ranks
 * take part in the allgather and get *newcomm = NULL (src/init.cc ncclCommInitChildComm).  The child is
 * stored to *newcomm when complete (ncclCommInitRankFunc's exit).
 */
static ncclResult_t split_run(const struct split_job *j)
{
    struct ncclComm *comm = j->parent, *child = NULL;
    int mine[2] = { j->color, j->key }, nranks = 0, myrank = 0, *all;
    uint64_t hacc;
    ncclResult_t rc;

    if ((all = calloc((size_t)comm->nranks, sizeof(mine))) == NULL) {
        free(j->name);
        return ncclSystemError;
    }
    rc = twin_allgather_bytes(comm, mine, all, sizeof(mine));
    if (rc != ncclSuccess || j->color == NCCL_SPLIT_NOCOLOR) {
        free(all);
        free(j->name);
        return rc;
    }
    for (int r = 0; r < comm->nranks; r++) {
        int c = all[2 * r], k = all[2 * r + 1];
        if (c != j->color)
            continue;
        nranks++;
        if (k < j->key || (k == j->key && r < comm->rank))
            myrank++;
    }
    free(all);
    /* child hash from (parent hash, split count, color), as src/init.cc ncclCommInitRankFunc */
    hacc = twin_hash(comm->hash, &j->split_count, sizeof(j->split_count));
    hacc = twin_hash(hacc, &j->color, sizeof(j->color));
    if (twin_trace_on())
        fprintf(stderr, "[twin nccl %d] split rank %d/%d color %d key %d -> rank %d/%d\n", (int)getpid(),
                comm->rank, comm->nranks, j->color, j->key, myrank, nranks);
    struct twin_prof_comm id = { .hash = twin_nccl_child_hash(comm->prof.hash, j->split_count, j->color),
                                 .name = j->name };
    rc = new_comm(&child, hacc, nranks, myrank, comm->device, j->blocking, &id);
    if (rc == ncclSuccess)
        __atomic_store_n(j->newcomm, child, __ATOMIC_RELEASE);
    return rc;
}

/* A non-blocking parent's split: its result becomes the parent's async result (src/group.cc groupLaunch). */
static void *split_job_main(void *arg)
{
    struct split_job *j = arg;
    ncclResult_t rc = split_run(j);
    __atomic_store_n(&j->parent->async_result, rc, __ATOMIC_RELEASE);
    free(j);
    return NULL;
}

/* Blocking or not is the parent's (ncclAsyncLaunch sets ncclGroupBlocking from the parent comm). */
NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config)
{
    struct split_job *j;

    if (!twin_comm_ok(comm) || newcomm == NULL || color < NCCL_SPLIT_NOCOLOR)
        return ncclInvalidArgument;
    *newcomm = NULL; /* "*newcomm should be NCCL_COMM_NULL until comm split fully complete" */
    /* every split gives a new comm, NOCOLOR ranks count it too (job->splitCount = ++comm->splitCount) */
    struct split_job job = { comm, color, key, ++comm->split_count, blocking_of(config, comm->blocking), newcomm,
                             name_of(config, comm->prof.name) };
    if (comm->blocking)
        return split_run(&job);
    if ((j = malloc(sizeof(*j))) == NULL) {
        free(job.name);
        return ncclSystemError;
    }
    *j = job;
    __atomic_store_n(&comm->async_result, ncclInProgress, __ATOMIC_RELEASE);
    if (start_job(split_job_main, j) != ncclSuccess) {
        __atomic_store_n(&comm->async_result, ncclSuccess, __ATOMIC_RELEASE);
        free(j->name);
        free(j);
        return ncclSystemError;
    }
    return ncclSuccess; /* ncclCommSplit returns `res`, not the nonblocking group end's ncclInProgress */
}

/* One shrink as NCCL's ncclCommInitRankAsyncJob holds it (the surviving ranks' new comm). */
struct shrink_job {
    struct ncclComm *parent;
    uint64_t hash;
    int nranks, rank, blocking;
    ncclComm_t *newcomm;
    char *name; /* taken by the new comm */
};

/* commHash of (parent hash, split count 0, color 0): a shrink's job counts no split (src/init.cc
 * ncclCommInitChildComm).  commName: the config's, else the parent's, read when the shrink was called. */
static ncclResult_t shrink_run(const struct shrink_job *j)
{
    struct ncclComm *child = NULL;
    struct twin_prof_comm id = { .hash = twin_nccl_child_hash(j->parent->prof.hash, 0, 0), .name = j->name };
    ncclResult_t rc = new_comm(&child, j->hash, j->nranks, j->rank, j->parent->device, j->blocking, &id);
    if (rc == ncclSuccess)
        __atomic_store_n(j->newcomm, child, __ATOMIC_RELEASE);
    return rc;
}

static void *shrink_job_main(void *arg)
{
    struct shrink_job *j = arg;
    ncclResult_t rc = shrink_run(j);
    __atomic_store_n(&j->parent->async_result, rc, __ATOMIC_RELEASE);
    free(j);
    return NULL;
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/*
 * As NCCL 2.28.9 src/init.cc ncclCommShrink -> ncclCommInitChildComm(isShrink) -> getParentRanks: the
 * excluded list is sorted in place (qsort), the excluded ranks must not call (ncclInvalidArgument if they do),
 * the others keep their order (color 0, key = parent rank).  It is a collective over the surviving ranks
 * only, so no allgather is needed: everyone knows the list.  NCCL_SHRINK_ABORT first stops the parent's
 * launched work and waits for it (setCommAbortFlags(comm, 1), ncclStrongStreamSynchronize on its device
 * stream, setCommAbortFlags(comm, 0)).  A non-blocking parent's shrink runs on a thread as its split does:
 * ncclSuccess with *newcomm NULL, the parent in progress until the child is published.
 */
NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
         ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    struct shrink_job job, *j;
    int below = 0;
    uint64_t hacc;

    if (!twin_comm_ok(comm) || newcomm == NULL || excludeRanksList == NULL || excludeRanksCount <= 0)
        return ncclInvalidArgument;
    qsort(excludeRanksList, (size_t)excludeRanksCount, sizeof(int), cmp_int);
    *newcomm = NULL;
    for (int i = 0; i < excludeRanksCount; i++) {
        if (excludeRanksList[i] == comm->rank)
            return ncclInvalidArgument;
        if (excludeRanksList[i] < comm->rank)
            below++;
    }
    if (shrinkFlags & NCCL_SHRINK_ABORT) {
        __atomic_store_n(&comm->aborted, 1, __ATOMIC_RELEASE);
        while (__atomic_load_n(&comm->pending, __ATOMIC_ACQUIRE) > 0)
            usleep(100);
        __atomic_store_n(&comm->aborted, 0, __ATOMIC_RELEASE);
    }
    hacc = twin_hash(comm->hash, excludeRanksList, sizeof(int) * (size_t)excludeRanksCount);
    hacc = twin_hash(hacc, "shrink", 6);
    job = (struct shrink_job){ comm, hacc, comm->nranks - excludeRanksCount, comm->rank - below,
                               blocking_of(config, comm->blocking), newcomm, name_of(config, comm->prof.name) };
    if (comm->blocking)
        return shrink_run(&job);
    if ((j = malloc(sizeof(*j))) == NULL) {
        free(job.name);
        return ncclSystemError;
    }
    *j = job;
    __atomic_store_n(&comm->async_result, ncclInProgress, __ATOMIC_RELEASE);
    if (start_job(shrink_job_main, j) != ncclSuccess) {
        __atomic_store_n(&comm->async_result, ncclSuccess, __ATOMIC_RELEASE);
        free(j->name);
        free(j);
        return ncclSystemError;
    }
    return ncclSuccess;
}

/* Waits until every launched group holding an operation of the comm has run. */
static void flush(struct ncclComm *c)
{
    while (__atomic_load_n(&c->pending, __ATOMIC_ACQUIRE) > 0 && !__atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE))
        usleep(100);
}

/* Finalize flushes the comm's uncompleted operations (nccl.h 2.28.9 ncclCommFinalize; src/init.cc
 * commFinalize waits on the comm's streams for a blocking comm). */
NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm)
{
    if (!twin_comm_ok(comm))
        return ncclInvalidArgument;
    flush(comm);
    return ncclSuccess;
}

/* ncclCommDestroy(NULL) is ncclSuccess (src/init.cc ncclCommDestroy); it finalizes first, so it waits for the
 * comm's launched work, and so hangs while a peer that work waits for is dead, as NCCL's does (torch aborts
 * instead in that case). */
NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    if (comm->magic != TWIN_COMM_MAGIC)
        return ncclInvalidArgument;
    flush(comm);
    if (__atomic_load_n(&comm->aborted, __ATOMIC_ACQUIRE))
        return ncclSuccess; /* aborted meanwhile: the abort keeps the struct (see ncclCommAbort) */
    twin_prof_finalize(comm);
    comm->magic = 0;
    twin_shm_close(comm);
    twin_prof_comm_free(comm);
    free(comm);
    return ncclSuccess;
}

/* torch's watchdog calls this from its own thread while the comm's work may be waiting on a stream: mark it,
 * so work waiting for peers stops and launched work not yet started does nothing (nccl_group.c
 * group_job_run), as NCCL's kernels exit on the abort flag.  The struct is kept: a stream's worker may still
 * be reading it. */
NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    if (comm->magic != TWIN_COMM_MAGIC)
        return ncclInvalidArgument;
    __atomic_store_n(&comm->aborted, 1, __ATOMIC_RELEASE);
    twin_prof_finalize(comm); /* src/init.cc commReclaim -> commFree, on abort too */
    return ncclSuccess;
}

/* The comm's async result (src/init.cc ncclCommGetAsyncError: comm->asyncResult): ncclInProgress while a
 * non-blocking init or split runs, then its result; ncclRemoteError once aborted. */
NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError)
{
    if (comm == NULL || comm->magic != TWIN_COMM_MAGIC || asyncError == NULL)
        return ncclInvalidArgument;
    *asyncError = comm->aborted ? ncclRemoteError : __atomic_load_n(&comm->async_result, __ATOMIC_ACQUIRE);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count)
{
    if (!twin_comm_ok(comm) || count == NULL)
        return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device)
{
    if (!twin_comm_ok(comm) || device == NULL)
        return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank)
{
    if (!twin_comm_ok(comm) || rank == NULL)
        return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}
