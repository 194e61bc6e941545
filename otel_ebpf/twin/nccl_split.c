/*
 * Stand-in libnccl.so.2 for the twin, part 1b: child communicators, ncclCommSplit and ncclCommShrink, as NCCL 2.28.9
 * src/init.cc makes them (cited per function below).  Not NVIDIA's library.  A child is a new communicator
 * (nccl_comm.c twin_new_comm) whose ranks are found from the parent's; a non-blocking parent's split or shrink runs on
 * a thread of its own (nccl_comm.c twin_start_job), the parent in progress until the child is published.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_twin.h"

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
    rc = twin_new_comm(&child, hacc, nranks, myrank, comm->device, j->blocking, &id);
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
    struct split_job job = { comm, color, key, ++comm->split_count, twin_blocking_of(config, comm->blocking), newcomm,
                             twin_comm_name(config, comm->prof.name) };
    if (comm->blocking)
        return split_run(&job);
    if ((j = malloc(sizeof(*j))) == NULL) {
        free(job.name);
        return ncclSystemError;
    }
    *j = job;
    __atomic_store_n(&comm->async_result, ncclInProgress, __ATOMIC_RELEASE);
    if (twin_start_job(split_job_main, j) != ncclSuccess) {
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
    ncclResult_t rc = twin_new_comm(&child, j->hash, j->nranks, j->rank, j->parent->device, j->blocking, &id);
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

static int cmp_int(const void *a, const void *b)
{
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

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
                               twin_blocking_of(config, comm->blocking), newcomm,
                               twin_comm_name(config, comm->prof.name) };
    if (comm->blocking)
        return shrink_run(&job);
    if ((j = malloc(sizeof(*j))) == NULL) {
        free(job.name);
        return ncclSystemError;
    }
    *j = job;
    __atomic_store_n(&comm->async_result, ncclInProgress, __ATOMIC_RELEASE);
    if (twin_start_job(shrink_job_main, j) != ncclSuccess) {
        __atomic_store_n(&comm->async_result, ncclSuccess, __ATOMIC_RELEASE);
        free(j->name);
        free(j);
        return ncclSystemError;
    }
    return ncclSuccess;
}
