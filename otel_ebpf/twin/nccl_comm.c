/*
 * Stand-in libnccl.so.2 for the twin, part 1: versions, errors and communicators.  Not NVIDIA's library.
 * Follows NCCL 2.28.9 (the nvidia-nccl-cu13 torch 2.11.0 pins): its nccl.h for every prototype and value,
 * its src/init.cc for communicator semantics (cited per function below).  Exports every NCCL symbol torch
 * 2.11.0 imports (otel_ebpf/twin/build.py checks that against the installed wheel), and ncclCommCuDevice.
 *
 * A communicator here is a struct in the rank's process plus a shared-memory staging area that every rank
 * of it maps (nccl_coll.c).  "Bootstrap" collectives (the split's allgather) go through the parent's area.
 *
 * Known differences from NCCL 2.28.9, not fixed yet (docs/twin.md lists them):
 * - Non-blocking communicators (config->blocking = 0): init, split and shrink complete inside the call and
 *   return ncclSuccess, where NCCL returns ncclInProgress and publishes *newcomm later from its init thread.
 * - ncclCommShrink with NCCL_SHRINK_ABORT is treated as the default mode (no in-flight work to abort here).
 * - ncclCommInitRankScalable ignores all ids but the first (NCCL spreads its bootstrap over nId roots).
 * - ncclCommAbort does not free the communicator (another thread may be waiting in one of its collectives).
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

int twin_comm_ok(const struct ncclComm *c)
{
    return c != NULL && c->magic == TWIN_COMM_MAGIC && !c->aborted && c->nranks > 0;
}

static ncclResult_t new_comm(ncclComm_t *out, uint64_t hash, int nranks, int rank, int device)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    ncclResult_t rc;
    if (c == NULL)
        return ncclSystemError;
    *c = (struct ncclComm){ .magic = TWIN_COMM_MAGIC, .hash = hash, .rank = rank, .nranks = nranks, .device = device };
    rc = twin_shm_open(c);
    if (rc != ncclSuccess) {
        free(c);
        return rc;
    }
    if (twin_trace_on())
        fprintf(stderr, "[twin nccl %d] comm %p hash %016llx rank %d/%d\n", (int)getpid(), (void *)c,
                (unsigned long long)hash, rank, nranks);
    *out = c;
    return ncclSuccess;
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
    (void)config;
    if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    return new_comm(comm, twin_hash(0xcbf29ce484222325ULL, &commId, sizeof(commId)), nranks, rank, current_device());
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

/*
 * As NCCL 2.28.9 src/init.cc commGetSplitInfo: an allgather of (color, key) over the parent, then the
 * child's ranks are the parent ranks of the same color, ordered by key and, for equal keys, by parent rank
 * (the insertion loop there compares `key <=`, keeping parent order for ties).  NCCL_SPLIT_NOCOLOR ranks
 * take part in the allgather and get *newcomm = NULL (src/init.cc ncclCommInitChildComm).
 */
NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config)
{
    int mine[2] = { color, key }, nranks = 0, myrank = 0, *all;
    uint64_t hacc;
    ncclResult_t rc;

    (void)config;
    if (!twin_comm_ok(comm) || newcomm == NULL || color < NCCL_SPLIT_NOCOLOR)
        return ncclInvalidArgument;
    *newcomm = NULL; /* "*newcomm should be NCCL_COMM_NULL until comm split fully complete" */
    all = calloc((size_t)comm->nranks, sizeof(mine));
    if (all == NULL)
        return ncclSystemError;
    rc = twin_allgather_bytes(comm, mine, all, sizeof(mine));
    comm->split_count++; /* every split gives a new comm, NOCOLOR ranks count it too (job->splitCount) */
    if (rc != ncclSuccess || color == NCCL_SPLIT_NOCOLOR) {
        free(all);
        return rc;
    }
    for (int r = 0; r < comm->nranks; r++) {
        int c = all[2 * r], k = all[2 * r + 1];
        if (c != color)
            continue;
        nranks++;
        if (k < key || (k == key && r < comm->rank))
            myrank++;
    }
    free(all);
    /* child hash from (parent hash, split count, color), as src/init.cc ncclCommInitRankFunc */
    hacc = twin_hash(comm->hash, &comm->split_count, sizeof(comm->split_count));
    hacc = twin_hash(hacc, &color, sizeof(color));
    if (twin_trace_on())
        fprintf(stderr, "[twin nccl %d] split rank %d/%d color %d key %d -> rank %d/%d\n", (int)getpid(),
                comm->rank, comm->nranks, color, key, myrank, nranks);
    return new_comm(newcomm, hacc, nranks, myrank, comm->device);
}

/*
 * As src/init.cc ncclCommShrink -> ncclCommInitChildComm(isShrink) -> getParentRanks: the excluded ranks
 * must not call (ncclInvalidArgument if they do), the others keep their order (color 0, key = parent rank).
 * It is a collective over the surviving ranks only, so no allgather is needed: everyone knows the list.
 */
NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
         ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    int below = 0;
    uint64_t hacc;

    (void)config; (void)shrinkFlags;
    if (!twin_comm_ok(comm) || newcomm == NULL || excludeRanksList == NULL || excludeRanksCount <= 0)
        return ncclInvalidArgument;
    *newcomm = NULL;
    for (int i = 0; i < excludeRanksCount; i++) {
        if (excludeRanksList[i] == comm->rank)
            return ncclInvalidArgument;
        if (excludeRanksList[i] < comm->rank)
            below++;
    }
    hacc = twin_hash(comm->hash, excludeRanksList, sizeof(int) * (size_t)excludeRanksCount);
    hacc = twin_hash(hacc, "shrink", 6);
    return new_comm(newcomm, hacc, comm->nranks - excludeRanksCount, comm->rank - below, comm->device);
}

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm)
{
    return twin_comm_ok(comm) ? ncclSuccess : ncclInvalidArgument;
}

/* ncclCommDestroy(NULL) is ncclSuccess (src/init.cc ncclCommDestroy). */
NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    if (comm->magic != TWIN_COMM_MAGIC)
        return ncclInvalidArgument;
    comm->magic = 0;
    twin_shm_close(comm);
    free(comm);
    return ncclSuccess;
}

/* torch's watchdog calls this from its own thread while a collective may be waiting on the comm: mark it
 * so the waiter returns ncclRemoteError, and keep the struct (the waiter still reads it). */
NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    if (comm->magic != TWIN_COMM_MAGIC)
        return ncclInvalidArgument;
    __atomic_store_n(&comm->aborted, 1, __ATOMIC_RELEASE);
    return ncclSuccess;
}

/* Always complete (see the header comment): ncclSuccess, or ncclRemoteError once aborted. */
NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t *asyncError)
{
    if (comm == NULL || comm->magic != TWIN_COMM_MAGIC || asyncError == NULL)
        return ncclInvalidArgument;
    *asyncError = comm->aborted ? ncclRemoteError : ncclSuccess;
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

/* ---- buffer registration and NCCL-allocated memory: "device" memory is host memory (cudart.c) ---- */

NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    (void)size;
    if (!twin_comm_ok(comm) || handle == NULL)
        return ncclInvalidArgument;
    *handle = buff;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void *handle)
{
    (void)handle;
    return twin_comm_ok(comm) ? ncclSuccess : ncclInvalidArgument;
}

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
         int winFlags)
{
    (void)size; (void)winFlags;
    if (!twin_comm_ok(comm) || win == NULL)
        return ncclInvalidArgument;
    *win = (ncclWindow_t)buff;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win)
{
    (void)win;
    return twin_comm_ok(comm) ? ncclSuccess : ncclInvalidArgument;
}

NCCL_API(ncclResult_t, ncclMemAlloc, void **ptr, size_t size)
{
    if (ptr == NULL)
        return ncclInvalidArgument;
    return posix_memalign(ptr, 4096, size ? size : 1) == 0 ? ncclSuccess : ncclSystemError;
}

NCCL_API(ncclResult_t, ncclMemFree, void *ptr)
{
    free(ptr);
    return ncclSuccess;
}

/* The device-side API (nccl_device.h, C++ only, so these two prototypes are not checked against it):
 * torch probes it for symmetric memory; refused, torch then does not use it. */
struct ncclDevCommRequirements;
struct ncclDevComm;
__attribute__((visibility("default"))) ncclResult_t ncclDevCommCreate(ncclComm_t comm,
                                                                       const struct ncclDevCommRequirements *reqs,
                                                                       struct ncclDevComm *out)
{
    (void)comm; (void)reqs; (void)out;
    twin_set_last_error("otel-ebpf twin: the NCCL device API is not modelled");
    return ncclInvalidUsage;
}

__attribute__((visibility("default"))) ncclResult_t ncclDevCommDestroy(ncclComm_t comm,
                                                                        const struct ncclDevComm *devComm)
{
    (void)comm; (void)devComm;
    return ncclSuccess;
}
