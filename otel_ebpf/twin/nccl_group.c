/*
 * Stand-in libnccl.so.2 for the twin, part 3: groups and point-to-point.  Not NVIDIA's library.
 *
 * Groups, as NCCL 2.28.9 src/group.cc: ncclGroupStart/End nest per thread (ncclGroupDepth); every operation
 * is itself a group (src/enqueue.cc ncclEnqueueCheck wraps it in ncclGroupStartInternal/EndInternal), so
 * outside a group it runs at once, and inside one it is kept and run at the OUTERMOST ncclGroupEnd
 * (ncclGroupEndInternal: `if ((--ncclGroupDepth) > 0) goto exit;` then groupLaunch).  A send's or recv's
 * argument error inside a group is remembered and returned by that ncclGroupEnd, which then runs nothing
 * (ncclGroupErrCheck sets ncclGroupError; ncclGroupEndInternal `goto fail`).  ncclGroupSimulateEnd is the
 * same end with a ncclSimInfo_t: it checks NCCL_SIM_INFO_INITIALIZER's magic at the outermost level,
 * launches nothing (groupLaunch skips doLaunches when simInfo is set) and drops the group's operations
 * (groupLocalResetJobState).
 *
 * Send/recv (their data movement: nccl_p2p.c) are operations of the group like collectives.  At group end the
 * collectives run first, in call order (NCCL schedules a plan's collectives before its p2p: src/enqueue.cc
 * ncclLaunchPrepare), then every send and recv of the group progresses together, so a rank's grouped sends and
 * recvs to each other cannot deadlock, however large.  The profiler plugin's API events come with each
 * operation and each group end, its launch events with the outermost end, its kernel-channel times from the
 * stream's worker (nccl_prof_*.c).
 *
 * The outermost ncclGroupEnd launches the group onto its streams and returns (group_run); the work runs on
 * the stream's worker thread (cudart_streams.c), where the rank waits for its peers as NCCL's kernel does.
 *
 * Known differences from NCCL 2.28.9, not fixed yet (docs/twin.md lists them):
 * - Non-blocking groups (config.blocking = 0) launch inside the call and return ncclSuccess (NCCL may
 *   return ncclInProgress and launch from a thread; both are allowed outcomes for a caller).
 * - ncclGroupSimulateEnd's estimatedTime is 0 (no model of algorithms or link speeds).
 * - A collective's argument error inside a group is not remembered for ncclGroupEnd (nccl_coll.c returns it).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_twin.h"

#define SIM_MAGIC 0x74685283 /* NCCL_SIM_INFO_INITIALIZER's magic (nccl.h 2.28.9) */

/* ---- the calling thread's group (src/group.cc: ncclGroupDepth, ncclGroupError are __thread) ---- */

static __thread int group_depth;
static __thread ncclResult_t group_error;
static __thread struct twin_task *group_tasks;
static __thread int group_len, group_cap;

static void group_reset(void)
{
    group_len = 0;
    group_error = ncclSuccess;
    twin_prof_group_reset();
}

/* One launched group: its operations, run later by the stream's worker (cudart_streams.c __cudaTwinLaunch).  A
 * captured group is persistent (NCCL 2.28.9 src/enqueue.cc: a plan made while the stream captures): the graph
 * runs it at each replay and owns it; it is freed when the last graph or graph exec holding it goes, as NCCL's
 * persistentDestructor (ncclCudaGraphAddDestructor) frees such plans. */
struct group_job {
    int persistent; /* written by __cudaTwinLaunch before the job can run */
    int holds;      /* the launching call, plus its run (launched) or its graph (captured): the last frees it */
    int n;
    struct twin_prof_job *prof; /* the profiler's kernel-channel stamps and replays (nccl_prof_*.c), or NULL */
    struct twin_task tasks[];
};

static void group_job_release(struct group_job *j)
{
    if (__atomic_sub_fetch(&j->holds, 1, __ATOMIC_ACQ_REL) == 0) {
        twin_prof_job_free(j->prof);
        free(j);
    }
}

/* The graph's destructor of a captured job (cudart_graphs.c, with the last graph or exec holding it). */
static void group_job_free(void *arg) { group_job_release(arg); }

/* Runs a launched group on the stream's worker: collectives first in call order, then every send and recv
 * together.  A group with an operation on an aborted comm does nothing (NCCL's kernels exit on the abort
 * flag: src/device/common.h checks ncclShmem.comm.abortFlag), and one aborted while it waits stops
 * (ncclRemoteError inside).  A failure other than an abort becomes the comms' async error, as an error after
 * the launch does in NCCL (ncclCommGetAsyncError). */
static void group_job_run(void *arg)
{
    struct group_job *j = arg;
    ncclResult_t rc = ncclSuccess;
    if (j->persistent)
        twin_prof_replay(j->prof); /* a captured plan's hostStreamPlanTask, at each replay */
    for (int i = 0; i < j->n; i++) {
        j->tasks[i].done = 0; /* a replay's sends and recvs start over */
        if (__atomic_load_n(&j->tasks[i].comm->aborted, __ATOMIC_ACQUIRE))
            rc = ncclRemoteError;
    }
    for (int i = 0; i < j->n && rc == ncclSuccess; i++)
        if (j->tasks[i].kind == TWIN_COLL) {
            twin_prof_stamp(j->prof, i, 0);
            rc = j->tasks[i].run(&j->tasks[i]);
            twin_prof_stamp(j->prof, i, 1);
        }
    if (rc == ncclSuccess)
        rc = twin_run_p2p(j->tasks, j->n, j->prof);
    twin_prof_stamp_rest(j->prof); /* stopped early: profiler(FINI) on the way out */
    for (int i = 0; i < j->n; i++) {
        struct ncclComm *c = j->tasks[i].comm;
        ncclResult_t ok = ncclSuccess;
        if (rc != ncclSuccess && rc != ncclRemoteError)
            __atomic_compare_exchange_n(&c->async_result, &ok, rc, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        if (!j->persistent)
            __atomic_sub_fetch(&c->pending, 1, __ATOMIC_ACQ_REL);
    }
    if (!j->persistent)
        group_job_release(j); /* a graph's job is released by group_job_free, with the graph */
}

/* Each operation's comm has one more launch pending until the operation has run (group_job_run takes it back);
 * d = -1 takes them back here, for a group that was not launched, or was captured. */
static void pending_add(struct group_job *j, int d)
{
    for (int i = 0; i < j->n; i++)
        __atomic_add_fetch(&j->tasks[i].comm->pending, d, __ATOMIC_ACQ_REL);
}

/* Launches j (the calling thread's hold on it is dropped here) onto `streams` after `orders`; the CUDA error,
 * and in *persistent whether it became a graph's node. */
static cudaError_t group_launch(struct group_job *j, const cudaStream_t *streams, int nstreams,
                                struct twin_order *const *orders, int norders, int *persistent)
{
    cudaError_t crc;
    j->persistent = 0;
    j->holds = 2;
    pending_add(j, 1);
    crc = __cudaTwinLaunch(streams, nstreams, orders, norders, group_job_run, j, group_job_free, &j->persistent);
    *persistent = j->persistent;
    if (crc != cudaSuccess || j->persistent)
        pending_add(j, -1);
    if (crc != cudaSuccess)
        j->holds--; /* neither a run nor a graph holds it */
    group_job_release(j);
    return crc;
}

/* The outermost ncclGroupEnd: the group's operations go onto their streams as one piece of work and the call
 * returns, as NCCL 2.28.9 does once its kernel is enqueued (src/group.cc groupLaunch -> doLaunches ->
 * ncclLaunchKernel).  Every user stream of the group waits for the others' prior work and for the group, and
 * the group runs after the last work launched on each of its comms (cudart_streams.c __cudaTwinLaunch).  Nothing
 * waits here for peers: a rank that is late or dead shows as work that does not complete on the stream
 * (cudaEventQuery: cudaErrorNotReady), as on a GPU.  On capturing streams the group becomes a node of the graph
 * and runs at each replay (persistent, above), not now; it holds no launch pending on its comms. */
static ncclResult_t group_run(void)
{
    struct group_job *j;
    struct twin_prof_group *plans;
    cudaStream_t *streams;
    struct twin_order **orders;
    int nstreams = 0, norders = 0, n = group_len, persistent = 0;
    cudaError_t crc;
    if (group_len == 0)
        return ncclSuccess;
    j = malloc(sizeof(*j) + sizeof(struct twin_task) * (size_t)group_len);
    streams = malloc(sizeof(*streams) * (size_t)group_len);
    orders = malloc(sizeof(*orders) * (size_t)group_len);
    if (j == NULL || streams == NULL || orders == NULL) {
        free(j);
        free(streams);
        free(orders);
        group_reset();
        return ncclSystemError;
    }
    j->n = group_len;
    memcpy(j->tasks, group_tasks, sizeof(struct twin_task) * (size_t)group_len);
    plans = twin_prof_prepare(&j->prof); /* the profiler's kernel plans (src/enqueue.cc ncclLaunchPrepare) */
    for (int i = 0; i < group_len; i++) {
        int seen = 0;
        for (int k = 0; k < nstreams; k++)
            seen |= streams[k] == group_tasks[i].stream;
        if (!seen)
            streams[nstreams++] = group_tasks[i].stream;
        seen = 0;
        for (int k = 0; k < norders; k++)
            seen |= orders[k] == &group_tasks[i].comm->order;
        if (!seen)
            orders[norders++] = &group_tasks[i].comm->order;
    }
    group_reset();
    twin_prof_launch_begin(plans); /* doLaunches: the launch inside the first plan's KernelLaunch event */
    crc = group_launch(j, streams, nstreams, orders, norders, &persistent);
    twin_prof_launch_end(plans, crc == cudaSuccess, persistent);
    if (crc == cudaSuccess)
        twin_prof_seq(group_tasks, n, persistent);
    free(streams);
    free(orders);
    if (crc == cudaSuccess)
        return ncclSuccess;
    if (crc == cudaErrorStreamCaptureIsolation) { /* NCCL 2.28.9 src/enqueue.cc, checking the planner's streams */
        twin_set_last_error("Streams given to a communicator within a NCCL group must either be all uncaptured or "
                            "all captured by the same graph.");
        return ncclInvalidUsage;
    }
    twin_set_last_error("otel-ebpf twin: the CUDA runtime refused the group's stream");
    return ncclUnhandledCudaError;
}

static ncclResult_t group_end(ncclSimInfo_t *sim);

/* As src/enqueue.cc ncclEnqueueCheck: the call is a group of its own (ncclGroupStartInternal, taskAppend,
 * ncclGroupEndInternal), run at once outside a user's group; the profiler's API events come with the task. */
ncclResult_t twin_submit(const struct twin_task *t)
{
    ncclResult_t rc = ncclSuccess, end;
    twin_prof_enqueue();
    group_depth++;
    if (group_len == group_cap) {
        int cap = group_cap ? 2 * group_cap : 64;
        struct twin_task *grown = realloc(group_tasks, sizeof(*grown) * (size_t)cap);
        if (grown == NULL)
            rc = group_error = ncclSystemError;
        else
            group_tasks = grown;
        group_cap = grown != NULL ? cap : group_cap;
    }
    if (rc == ncclSuccess) {
        group_tasks[group_len] = *t;
        group_tasks[group_len].prof_ops = twin_prof_append(t, group_len, group_depth);
        group_len++;
    }
    end = group_end(NULL);
    return rc != ncclSuccess ? rc : end;
}

NCCL_API(ncclResult_t, ncclGroupStart)
{
    group_depth++;
    return ncclSuccess;
}

/* ncclInvalidUsage for an End without a Start; inner Ends only count down (src/group.cc ncclGroupEndInternal).
 * Every way out stops the group API event if the profiler's depth is back to 0. */
static ncclResult_t group_end(ncclSimInfo_t *sim)
{
    ncclResult_t rc = ncclSuccess;
    if (group_depth == 0) {
        twin_set_last_error("ncclGroupEnd: not in a group call.");
        twin_prof_group_api_stop();
        return ncclInvalidUsage;
    }
    twin_prof_group_end();
    if (--group_depth > 0) {
        rc = ncclSuccess;
    } else if ((rc = group_error) != ncclSuccess) {
        group_reset();
    } else if (sim == NULL) {
        rc = group_run();
    } else {
        group_reset(); /* simulated: nothing launched, the operations are dropped */
        if (sim->magic != SIM_MAGIC) {
            twin_set_last_error("ncclSimInfo_t argument not initialized via NCCL_SIM_INFO_INITIALIZER");
            rc = ncclInvalidArgument;
        } else {
            sim->estimatedTime = 0.0f; /* no model of algorithms or link speeds */
        }
    }
    twin_prof_group_api_stop();
    return rc;
}

NCCL_API(ncclResult_t, ncclGroupEnd)
{
    return group_end(NULL);
}

/* ncclGroupSimulateEnd(NULL) is a plain ncclGroupEnd in NCCL 2.28.9 (ncclGroupEndInternal(simInfo = NULL)). */
NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t *simInfo)
{
    return group_end(simInfo);
}

/* ---- point-to-point (src/collectives.cc ncclSend/ncclRecv -> ncclEnqueueCheck) ---- */

/* src/enqueue.cc ArgsCheck: a valid comm and type, a peer in [0, nranks), a buffer when count > 0.  Inside a
 * group the error is also remembered for ncclGroupEnd (ncclGroupErrCheck). */
static ncclResult_t p2p_submit(enum twin_kind kind, const void *buf, size_t count, ncclDataType_t type, int peer,
                               ncclComm_t comm, cudaStream_t stream)
{
    struct twin_task t = { .kind = kind, .func = kind == TWIN_SEND ? TWIN_F_SEND : TWIN_F_RECV, .count = count,
                           .type = type, .root = peer, .comm = comm, .stream = stream };
    if (!twin_comm_ok(comm) || twin_type_size(type) == 0 || peer < 0 || peer >= comm->nranks
        || (count > 0 && buf == NULL)) {
        if (group_depth > 0)
            group_error = ncclInvalidArgument;
        return ncclInvalidArgument;
    }
    if (kind == TWIN_SEND)
        t.send = buf;
    else
        t.recv = (void *)buf;
    if (twin_trace_on())
        fprintf(stderr, "[twin nccl %d] %s comm %p rank %d peer %d count %zu\n", (int)getpid(),
                kind == TWIN_SEND ? "ncclSend" : "ncclRecv", (void *)comm, comm->rank, peer, count);
    return twin_submit(&t);
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream)
{
    return p2p_submit(TWIN_SEND, sendbuff, count, datatype, peer, comm, stream);
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
         cudaStream_t stream)
{
    return p2p_submit(TWIN_RECV, recvbuff, count, datatype, peer, comm, stream);
}
