/*
 * Stand-in libnccl.so.2 for the twin, part 1: versions, errors and communicators.  Not NVIDIA's library.
 * Follows NCCL 2.28.9 (the nvidia-nccl-cu13 torch 2.11.0 pins): its nccl.h for every prototype and value,
 * its src/init.cc for communicator semantics (cited per function below).  Exports every NCCL symbol torch
 * 2.11.0 imports (otel_ebpf/twin/build.py checks that against the installed wheel), and ncclCommCuDevice.
 *
 * A communicator here is a struct in the rank's process plus a shared-memory staging area that every rank
 * of it maps (nccl_coll.c).  "Bootstrap" collectives (the split's allgather) go through the parent's area.
 * Splits and shrinks: nccl_split.c.  The profiler plugin's init and finalize (nccl_profiler.c) come where NCCL
 * calls them: once the comm is set up, and when it is destroyed or aborted.
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
int twin_blocking_of(const ncclConfig_t *config, int inherited)
{
    const char *env = getenv("NCCL_COMM_BLOCKING");
    if (env != NULL && (strcmp(env, "0") == 0 || strcmp(env, "1") == 0))
        return env[0] == '1';
    if (config == NULL)
        return inherited;
    return config->blocking == NCCL_CONFIG_UNDEF_INT ? 1 : config->blocking != 0;
}

/* config.commName (src/init.cc parseCommConfig; a split without a config copies the parent's), owned by the comm. */
char *twin_comm_name(const ncclConfig_t *config, const char *inherited)
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

ncclResult_t twin_new_comm(ncclComm_t *out, uint64_t hash, int nranks, int rank, int device, int blocking,
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
ncclResult_t twin_start_job(void *(*fn)(void *), void *arg)
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
    int blocking = twin_blocking_of(config, 1);
    struct twin_prof_comm id = { .hash = twin_nccl_hash(commId.internal, NCCL_UNIQUE_ID_BYTES) };
    struct ncclComm *c;
    if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    id.name = twin_comm_name(config, NULL);
    if (blocking)
        return twin_new_comm(comm, hash, nranks, rank, current_device(), 1, &id);
    if ((c = alloc_comm(hash, nranks, rank, current_device(), 0, &id)) == NULL)
        return ncclSystemError;
    c->async_result = ncclInProgress;
    if (twin_start_job(init_job, c) != ncclSuccess) {
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
