/*
 * Stand-in libnccl.so.2 for the twin, part 6: the profiler's API events, as NCCL 2.28.9 makes them.  Not NVIDIA's
 * code.  Follows src/plugin/profiler.cc (ncclProfilerStart/Stop/RecordGroupApiEvent*, Start/StopCollApiEvent,
 * Start/StopP2pApiEvent, the per-thread ncclProfilerApiState) and where src/enqueue.cc and src/group.cc call them:
 *
 * - every collective or send/recv call (ncclEnqueueCheck): profilerGroupDepth++ when a group API event is open,
 *   then, for each NCCL task it makes (taskAppend: none for an empty collective or a one-rank comm, one per
 *   collective, one per send or recv, 2 x nranks sends and recvs for ncclAlltoAll), re-read the global mask;
 *   start a GroupApi event if none is open (groupDepth = ncclGroupDepth, the call's implicit group counted) and
 *   record ncclProfilerGroupStartApiStop once; start the CollApi or P2pApi event under it; the task keeps the
 *   mask and the handles; stop the API event.  ncclProfilerStopCollApiEvent does not clear its handle (the P2p
 *   one does): when the mask drops the collective API bits, NCCL 2.28.9 hands the last CollApi handle to the
 *   next collective's task and stops it again, and so does the twin.
 * - every ncclGroupEndInternal (the call's own, a user's ncclGroupEnd): profilerGroupDepth--, and at 0
 *   ncclProfilerGroupEndApiStart once; the outermost one launches; each ends with ncclProfilerStopGroupApiEvent
 *   (only at depth 0).  ncclGroupStart makes no event.
 *
 * API events carry rank 0 (NCCL leaves eDescr.rank unset for them); graphCaptured is whether the call's stream
 * was in an active capture (ncclPlannerSetCapturingGraph).  The NCCL tasks are kept, per thread, until the group
 * launches (nccl_prof_plan.c).  Nothing here runs without a plugin but the first test of each hook.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "nccl_prof.h"

#define GROUP_API_MASK (ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | ncclProfileKernelLaunch \
                        | ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp             \
                        | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)
#define P2P_API_MASK (ncclProfileP2pApi | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep \
                      | ncclProfileKernelCh | ncclProfileNetPlugin)
#define COLL_API_MASK (ncclProfileCollApi | ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep \
                       | ncclProfileKernelCh | ncclProfileNetPlugin)

enum { STATE_RESET, STATE_STARTED, STATE_STOPPED }; /* src/include/profiler.h groupApiState */

/* ncclProfilerApiState (__thread) */
static __thread struct {
    int depth;  /* profilerGroupDepth */
    int mask;   /* eActivationMask */
    int state;
    void *group_api, *p2p_api, *coll_api;
} api;

static __thread struct prof_op *ops;
static __thread int nops, cap_ops;

/* src/collectives.cc ncclFuncToString */
const char *twin_func_name(int func)
{
    static const char *const names[TWIN_NFUNCS] = { "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce",
                                                    "SendRecv", "Send", "Recv", "AlltoAll", "Scatter", "Gather" };
    return func >= 0 && func < TWIN_NFUNCS ? names[func] : "Invalid";
}

/* src/collectives.cc ncclDatatypeToString: ncclUint8 is not in its list. */
const char *twin_type_name(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: return "ncclInt8";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    case ncclFloat8e4m3: return "ncclFloat8e4m3";
    case ncclFloat8e5m2: return "ncclFloat8e5m2";
    default: return "Unknown";
    }
}

void twin_prof_enqueue(void)
{
    if (api.depth > 0)
        api.depth++;
}

/* ncclProfilerStartGroupApiEvent: the mask is read at every call, the event started only outside one. */
static void group_api_start(struct ncclComm *comm, int depth, int captured)
{
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileGroupApi;
    d.groupApi.graphCaptured = captured;
    api.mask = __atomic_load_n(&twin_prof_mask, __ATOMIC_RELAXED);
    if (twin_profiler != NULL && (api.mask & GROUP_API_MASK) && api.depth == 0) {
        d.groupApi.groupDepth = depth;
        twin_profiler->startEvent(comm->prof.ctx, &api.group_api, &d);
        api.depth = depth;
        api.state = STATE_STARTED;
    }
}

/* ncclProfilerRecordGroupApiEventState: StartApiStop once after the start, EndApiStart once after that. */
static void group_api_record(int state)
{
    int record = 0;
    if (state == TWIN_GROUP_START_API_STOP && api.state == STATE_STARTED) {
        api.state = STATE_STOPPED;
        record = 1;
    } else if (state == TWIN_GROUP_END_API_START && api.state == STATE_STOPPED) {
        api.state = STATE_RESET;
        record = 1;
    }
    if (twin_profiler != NULL && api.group_api != NULL && record)
        twin_profiler->recordEventState(api.group_api, (ncclProfilerEventState_v5_t)state, NULL);
}

void twin_prof_group_end(void)
{
    if (api.depth > 0)
        api.depth--;
    if (api.depth == 0)
        group_api_record(TWIN_GROUP_END_API_START);
}

void twin_prof_group_api_stop(void)
{
    void *h = api.group_api;
    if (twin_profiler != NULL && h != NULL && api.depth == 0) {
        twin_profiler->stopEvent(h);
        api.group_api = NULL;
    }
}

void twin_prof_group_reset(void) { nops = 0; }

/* The NCCL task as ncclTaskColl / ncclTaskP2p hold it, with the API state it was made under. */
static struct prof_op *new_op(const struct twin_task *t, int index, int func, int captured, void *api_handle)
{
    struct prof_op *op;
    if (nops == cap_ops) {
        int cap = cap_ops ? 2 * cap_ops : 16;
        struct prof_op *grown = realloc(ops, sizeof(*grown) * (size_t)cap);
        if (grown == NULL)
            return NULL;
        ops = grown;
        cap_ops = cap;
    }
    op = &ops[nops++];
    *op = (struct prof_op){ .task = index, .func = func, .mask = api.mask, .captured = captured, .peer = t->root,
                            .comm = t->comm, .stream = t->stream, .send = t->send, .recv = t->recv, .count = t->count,
                            .type = t->type, .op = t->op, .group_api = api.group_api, .api = api_handle };
    return op;
}

/* p2pTaskAppend */
static int p2p_append(const struct twin_task *t, int index, int depth, int captured, int func, void *buff,
                      int peer)
{
    ncclProfilerEventDescr_v5_t d;
    struct prof_op *op;
    group_api_start(t->comm, depth, captured);
    group_api_record(TWIN_GROUP_START_API_STOP);
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileP2pApi;
    d.parentObj = api.group_api;
    d.p2pApi.func = twin_func_name(func); /* info->coll, set to Send or Recv first */
    d.p2pApi.count = t->count;
    d.p2pApi.datatype = twin_type_name(t->type);
    d.p2pApi.stream = (void *)t->stream;
    d.p2pApi.graphCaptured = captured != 0;
    if (twin_profiler != NULL && (api.mask & P2P_API_MASK))
        twin_profiler->startEvent(t->comm->prof.ctx, &api.p2p_api, &d);
    if ((op = new_op(t, index, func, captured, api.p2p_api)) != NULL) {
        op->peer = peer;
        op->send = NULL;
        op->recv = buff;
    }
    if (twin_profiler != NULL && api.p2p_api != NULL) { /* ncclProfilerStopP2pApiEvent */
        twin_profiler->stopEvent(api.p2p_api);
        api.p2p_api = NULL;
    }
    return op != NULL;
}

/* collTaskAppend: AllGather and Broadcast become bytes of ncclInt8 in the task, not in the CollApi event. */
static int coll_append(const struct twin_task *t, int index, int depth, int captured)
{
    ncclProfilerEventDescr_v5_t d;
    struct prof_op *op;
    group_api_start(t->comm, depth, captured);
    group_api_record(TWIN_GROUP_START_API_STOP);
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileCollApi;
    d.parentObj = api.group_api;
    d.collApi.func = twin_func_name(t->func);
    d.collApi.count = t->count;
    d.collApi.datatype = twin_type_name(t->type);
    d.collApi.stream = (void *)t->stream;
    d.collApi.root = t->root;
    d.collApi.graphCaptured = captured != 0;
    if (twin_profiler != NULL && (api.mask & COLL_API_MASK))
        twin_profiler->startEvent(t->comm->prof.ctx, &api.coll_api, &d);
    if ((op = new_op(t, index, t->func, captured, api.coll_api)) != NULL
        && (t->func == TWIN_F_ALLGATHER || t->func == TWIN_F_BROADCAST)) {
        op->count *= twin_type_size(t->type);
        op->type = ncclInt8;
    }
    if (twin_profiler != NULL && api.coll_api != NULL) /* ncclProfilerStopCollApiEvent: the handle stays */
        twin_profiler->stopEvent(api.coll_api);
    return op != NULL;
}

int twin_prof_append(const struct twin_task *t, int index, int group_depth)
{
    struct ncclComm *c = t->comm;
    int captured, n = 0;
    size_t bytes;
    if (twin_profiler == NULL)
        return 0;
    if (t->kind == TWIN_COLL && (t->count == 0 || c->nranks == 1))
        return 0; /* taskAppend: "Empty collectives can be discarded"; one rank: ncclLaunchOneRank, no task */
    captured = __cudaTwinStreamCapturing(t->stream);
    if (t->kind != TWIN_COLL)
        return p2p_append(t, index, group_depth, captured, t->func, t->kind == TWIN_SEND ? (void *)t->send : t->recv,
                          t->root);
    if (t->func != TWIN_F_ALLTOALL)
        return coll_append(t, index, group_depth, captured);
    bytes = t->count * twin_type_size(t->type);
    for (int r = 0; r < c->nranks; r++) {
        n += p2p_append(t, index, group_depth, captured, TWIN_F_SEND, (char *)t->send + (size_t)r * bytes, r);
        n += p2p_append(t, index, group_depth, captured, TWIN_F_RECV, (char *)t->recv + (size_t)r * bytes, r);
    }
    return n;
}

/* The thread's NCCL tasks of the group now launching, handed over (nccl_prof_plan.c); the list starts empty. */
struct prof_op *twin_prof_take(int *n)
{
    struct prof_op *taken = ops;
    *n = nops;
    ops = NULL;
    nops = cap_ops = 0;
    return taken;
}
