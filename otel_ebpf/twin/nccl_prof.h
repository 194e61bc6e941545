/*
 * Private header of the twin's profiler-plugin support (nccl_profiler.c: loading and init/finalize;
 * nccl_prof_api.c: API events; nccl_prof_plan.c: launch, group and task events; nccl_prof_order.c: the planner's
 * order and the twin's tuning; nccl_prof_proxy.c: kernel-channel events).  The plugin's types come from the
 * headers NCCL 2.28.9 gives plugin writers (ext-profiler/example/nccl/, copied unchanged into include/nccl/).  NCCL's
 * own src/include/plugin/profiler/profiler_v5.h declares groupApi.graphCaptured as bool where they say int: NCCL
 * zero-fills the descriptor and writes one byte, so the bytes a plugin reads are those written here through the int.
 */
#ifndef OTEL_EBPF_TWIN_NCCL_PROF_H
#define OTEL_EBPF_TWIN_NCCL_PROF_H

#include "nccl_twin.h" /* nccl.h first: the plugin headers take ncclResult_t from it */
#include "nccl/profiler.h"

/* src/include/plugin/nccl_profiler.h names 23 and 24 ncclProfilerGroupStartApiStop and ncclProfilerGroupEndApiStart;
 * the plugin headers of the same release call them ncclProfilerEndGroupApiStart and ncclProfilerBeginGroupApiEnd. */
#define TWIN_GROUP_START_API_STOP 23
#define TWIN_GROUP_END_API_START 24

/* ncclProfiler (src/plugin/profiler.cc): the table in use, the plugin's v5 or the twin's v4 adapter; NULL when no
 * plugin is loaded.  Read without a lock on every path, as NCCL reads it. */
extern const ncclProfiler_v5_t *twin_profiler;
/* ncclProfilerEventMask: the int* every init gets; a plugin may change it at any time. */
extern int twin_prof_mask;

/* One NCCL task (ncclTaskColl or ncclTaskP2p) as taskAppend makes it: a twin task is one, or for ncclAlltoAll
 * 2 x nranks (send and recv per peer, src/enqueue.cc taskAppend). */
struct prof_op {
    int task;                     /* index of the twin task in its group */
    int func;                     /* enum twin_func: Send/Recv for p2p and for AlltoAll's parts */
    int mask;                     /* eActivationMask when it was appended */
    int captured;                 /* the stream was capturing (graphCaptured) */
    int peer;                     /* p2p: the peer; coll: the root */
    struct ncclComm *comm;
    cudaStream_t stream;
    const void *send;
    void *recv;                   /* p2p: the buffer */
    size_t count;                 /* as the task holds it: bytes for AllGather and Broadcast */
    ncclDataType_t type;          /* ncclInt8 for AllGather and Broadcast */
    ncclRedOp_t op;
    void *group_api, *api, *event; /* groupApiEventHandle, coll/p2pApiEventHandle, eventHandle */
    uint8_t nch, nwarps, chan0;   /* channels, warps, first channel */
    const char *algo, *proto;
    uint64_t wc[TWIN_NCHANNELS];  /* the channels' work counters (ncclProxyOp.workCounter) */
};

static inline int twin_is_p2p(int func) { return func == TWIN_F_SEND || func == TWIN_F_RECV; }

/* The i-th channel of op: a collective's from chan0 up, a p2p's ncclP2pChannelForPart (base + part, wrapped). */
static inline uint8_t twin_channel_of(const struct prof_op *op, int i)
{
    return (uint8_t)(twin_is_p2p(op->func) ? (op->chan0 + i) & (TWIN_NCHANNELS - 1) : op->chan0 + i);
}

/* One kernel plan (struct ncclKernelPlan): one per communicator of a group, its colls then its p2ps. */
struct prof_plan {
    int first, ncoll, np2p;       /* ops[first .. first + ncoll + np2p) */
    cudaStream_t stream;          /* planner->streams->stream: the comm's last new stream */
    int persistent, proxy;        /* captured; hasProxyOps */
    void *launch_event, *group_event;
};

struct twin_prof_group {
    int nops, nplans;
    struct prof_op *ops;
    struct prof_plan *plans;
};

/* Where the stream engine writes a channel's start or end of work (nccl_prof_proxy.c). */
struct prof_stamp {
    int task, op;
    struct ncclComm *comm;
    uint8_t ch, chi;
    uint64_t wc;
    int started, stopped;
};

struct twin_prof_job {
    struct twin_prof_group *replay; /* a captured group's plans, run at each replay; NULL otherwise */
    int nstamps;
    struct prof_stamp stamps[];
};

/* nccl_prof_api.c */
const char *twin_func_name(int func);        /* src/collectives.cc ncclFuncToString */
const char *twin_type_name(ncclDataType_t t); /* ncclDatatypeToString */
struct prof_op *twin_prof_take(int *n);      /* the thread's NCCL tasks of the launching group (caller frees) */

/* nccl_prof_order.c: in[0..k) (a comm's tasks in append order; p2p: consumed) -> out, in the planner's order */
void twin_prof_order_colls(const struct prof_op *ops, const int *in, int k, int *out, int *scratch);
void twin_prof_order_p2p(const struct prof_op *ops, int *in, int k, int *out, int rank, int nranks);
void twin_prof_tune_coll(struct prof_op *o); /* algo, proto, nch, nwarps, chan0 */
void twin_prof_tune_p2p(struct prof_op *o);  /* nch, chan0 */

/* nccl_prof_plan.c */
void twin_prof_plan_task(struct twin_prof_group *g, struct prof_plan *p);
void twin_prof_group_free(struct twin_prof_group *g);

/* nccl_prof_proxy.c */
uint64_t twin_prof_now(void);
struct twin_prof_proxy *twin_prof_proxy_of(struct ncclComm *c);
/* uploadProxyOps: one kernel-channel sub per channel of op for the comm's proxy thread. */
void twin_prof_proxy_post(const struct prof_op *op);
/* Stops the comm's proxy thread: at once when the comm is aborted, else once its posted subs are done (src/proxy.cc
 * ncclProxyProgress runs while `stop == 0 || (stop == 1 && active)` and the abort flag is clear). */
void twin_prof_proxy_stop(struct ncclComm *c);

/* nccl_profiler.c: NCCL's logger as handed to init (src/debug.cc ncclDebugLog), and its INFO. */
void twin_debug_log(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt, ...);
#define TWIN_INFO(...) twin_debug_log(NCCL_LOG_INFO, NCCL_INIT, __FILE__, __LINE__, __VA_ARGS__)

#endif
