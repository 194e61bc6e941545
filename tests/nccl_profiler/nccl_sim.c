/* The profiler-plugin side of NCCL 2.28.9, modelled (nccl_sim.h). Function names are NCCL's; each says which NCCL
 * function it follows (src/plugin/profiler.cc unless named otherwise). Differences from NCCL: one communicator per
 * group; a plan's p2p tasks keep their call order (NCCL schedules them by peer); the "kernel" starts once the
 * group's API call returned (in NCCL it may start as soon as hostStreamPlanTask appended the proxy ops, racing the
 * application thread's stops), and that call waits for it, as an application's stream synchronize would. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "nccl_sim.h"

#define MAX_TASKS 16
#define MAX_OPS 64
#define NCHANNELS 2 /* what the (absent) tuner gives every task: nChannels */

/* src/include/comm.h ncclTaskColl / ncclTaskP2p: the fields the profiler reads */
struct task {
    bool isColl;
    int func;
    size_t count;
    int root; /* p2p: the peer */
    char *buff;
    int eActivationMask;
    void *groupApiEventHandle, *apiEventHandle, *eventHandle;
};
/* src/include/proxy.h ncclProxySubArgs, the profiler's part */
struct proxy_op {
    void *profilerContext, *taskEventHandle, *kernelEventHandle;
    int eActivationMask;
    uint8_t channelId;
};

static void *g_lib;
static ncclProfiler_v6_t *ncclProfiler; /* src/plugin/profiler.cc ncclProfiler; v5 tables are called the same way */
static int ncclProfilerEventMask;
static const struct sim_hooks *g_hooks;
static int g_inline_proxy;
static ncclDebugLogger_t g_log;

/* src/include/profiler.h ncclProfilerApiState_t, src/group.cc ncclGroupDepth: thread-local */
enum { StateReset = 0, StateStarted = 1, StateStopped = 2 };
static __thread struct {
    int profilerGroupDepth, eActivationMask, state;
    void *groupApiEventHandle, *p2pApiEventHandle, *collApiEventHandle;
} api;
static __thread int ncclGroupDepth;
static __thread struct task g_tasks[MAX_TASKS];
static __thread int g_ntasks;
static __thread struct sim_comm *g_group_comm;

static pthread_t g_proxy;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static struct proxy_op g_ops[MAX_OPS];
static int g_nops, g_pending, g_quit;
static uint64_t g_gputime = 1000000000ull; /* the GPU's %globaltimer, ns */

/* a v5 plugin reads the v5 prefix of the zeroed v6 descriptor */
static void start(void *ctx, void **h, ncclProfilerEventDescr_v6_t *d, int proxy)
{
    ncclProfiler->startEvent(ctx, h, d);
    if (g_hooks)
        g_hooks->trace_start(d, ctx, *h, proxy);
}
static void stop(void *h, int proxy)
{
    ncclProfiler->stopEvent(h);
    if (g_hooks)
        g_hooks->trace_stop(h, proxy);
}
static void record(void *h, int state, ncclProfilerEventStateArgs_v5_t *a, int proxy)
{
    ncclProfiler->recordEventState(h, state, a);
    if (g_hooks)
        g_hooks->trace_record(h, state, a, proxy);
}

/* ncclProfilerStartProxyCtrlEvent / RecordProxyCtrlEventState / StopProxyCtrlEvent as src/proxy.cc
 * ncclProxyGetPostedOps brackets an append; then src/transport/profiler.cc profilerProxyProgress: every channel's
 * ncclProfilerStartKernelChEvent first, then ncclProfilerStopKernelChEvent (record KernelChStop, stop). */
static void proxy_progress(int proxy)
{
    void *ctrl = NULL;
    int added = g_nops;
    if (ncclProfiler && (__atomic_load_n(&ncclProfilerEventMask, __ATOMIC_RELAXED) & ncclProfileProxyCtrl)) {
        ncclProfilerEventDescr_v6_t d = {0};
        d.type = ncclProfileProxyCtrl;
        start(g_ops[0].profilerContext, &ctrl, &d, proxy);
    }
    int ctrl_on = ncclProfiler && ctrl &&
                  (__atomic_load_n(&ncclProfilerEventMask, __ATOMIC_RELAXED) & ncclProfileProxyCtrl);
    ncclProfilerEventStateArgs_v5_t ca = {0};
    if (ctrl_on)
        record(ctrl, ncclProfilerProxyCtrlAppend, &ca, proxy);
    for (int i = 0; i < g_nops; i++) {
        struct proxy_op *sub = &g_ops[i];
        sub->kernelEventHandle = NULL; /* a fresh sub; NCCL's memory pool hands out zeroed ones first */
        if (ncclProfiler && (sub->eActivationMask & ncclProfileKernelCh)) {
            ncclProfilerEventDescr_v6_t d = {0};
            d.type = ncclProfileKernelCh;
            d.parentObj = sub->taskEventHandle;
            d.kernelCh.channelId = sub->channelId;
            d.kernelCh.pTimer = g_gputime + 10 * (uint64_t)i;
            start(sub->profilerContext, &sub->kernelEventHandle, &d, proxy);
        }
    }
    for (int i = 0; i < g_nops; i++) {
        struct proxy_op *sub = &g_ops[i];
        if (ncclProfiler && sub->kernelEventHandle) {
            ncclProfilerEventStateArgs_v5_t a = {0};
            a.kernelCh.pTimer = g_gputime + 10 * (uint64_t)i + 500;
            record(sub->kernelEventHandle, ncclProfilerKernelChStop, &a, proxy);
            stop(sub->kernelEventHandle, proxy);
        }
    }
    if (ctrl_on) {
        ca.proxyCtrl.appendedProxyOps = added;
        record(ctrl, ncclProfilerProxyCtrlAppendEnd, &ca, proxy);
    }
    if (ncclProfiler && ctrl)
        stop(ctrl, proxy);
    g_gputime += 100000;
    g_nops = 0;
}

static void *proxy_thread(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        while (!g_pending && !g_quit)
            pthread_cond_wait(&g_cond, &g_lock);
        if (g_quit)
            break;
        proxy_progress(1);
        g_pending = 0;
        pthread_cond_broadcast(&g_cond);
    }
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

int sim_load(const char *path, int version, const struct sim_hooks *hooks, int inline_proxy, ncclDebugLogger_t log)
{
    g_hooks = hooks;
    g_inline_proxy = inline_proxy;
    g_log = log;
    if (path) {
        /* src/plugin/profiler.cc ncclProfilerPluginLoad: v5 only in 2.28.9; NCCL master tries v6 first */
        g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!g_lib)
            return -1;
        if (version == 6)
            ncclProfiler = dlsym(g_lib, "ncclProfiler_v6");
        if (!ncclProfiler)
            ncclProfiler = dlsym(g_lib, "ncclProfiler_v5");
        if (!ncclProfiler)
            return -2;
    }
    return inline_proxy ? 0 : pthread_create(&g_proxy, NULL, proxy_thread, NULL);
}

void sim_unload(void)
{
    if (!g_inline_proxy) {
        pthread_mutex_lock(&g_lock);
        g_quit = 1;
        pthread_cond_broadcast(&g_cond);
        pthread_mutex_unlock(&g_lock);
        pthread_join(g_proxy, NULL);
    }
    if (g_lib)
        dlclose(g_lib); /* ncclProfilerPluginUnload -> ncclClosePluginLib */
}

int sim_mask(void) { return __atomic_load_n(&ncclProfilerEventMask, __ATOMIC_RELAXED); }
/* NCCL 2.32 ncclProfilerSetRasOverride (not in 2.28.9): a job-wide mask set from outside the plugin */
void sim_ras_override(int mask) { __atomic_store_n(&ncclProfilerEventMask, mask, __ATOMIC_RELAXED); }

int sim_comm_init(struct sim_comm *comm)
{
    if (!ncclProfiler)
        return 0;
    return ncclProfiler->init(&comm->profilerContext, comm->commHash, &ncclProfilerEventMask, comm->commName,
                              comm->nNodes, comm->nRanks, comm->rank, g_log);
}

void sim_comm_finalize(struct sim_comm *comm)
{
    if (ncclProfiler && comm->profilerContext)
        ncclProfiler->finalize(comm->profilerContext);
}

/* ncclProfilerStartGroupApiEvent + ncclProfilerRecordGroupApiEventState(ncclProfilerGroupStartApiStop) */
static void start_group_api(struct sim_comm *comm)
{
    ncclProfilerEventDescr_v6_t d = {0};
    d.type = ncclProfileGroupApi;
    api.eActivationMask = __atomic_load_n(&ncclProfilerEventMask, __ATOMIC_RELAXED);
    int groupApiMask = ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | ncclProfileKernelLaunch |
                       ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp |
                       ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin;
    if (ncclProfiler && (api.eActivationMask & groupApiMask) && api.profilerGroupDepth == 0) {
        d.groupApi.groupDepth = ncclGroupDepth;
        start(comm->profilerContext, &api.groupApiEventHandle, &d, 0);
        api.profilerGroupDepth = ncclGroupDepth;
        api.state = StateStarted;
    }
    if (api.state == StateStarted) {
        api.state = StateStopped;
        if (ncclProfiler && api.groupApiEventHandle)
            record(api.groupApiEventHandle, ncclProfilerGroupStartApiStop, NULL, 0);
    }
}

/* src/enqueue.cc collTaskAppend / p2pTaskAppend with ncclProfilerStart{Coll,P2p}ApiEvent and their Stop */
static void task_append(struct sim_comm *comm, bool isColl, int func, size_t count, int root, char *buff)
{
    g_group_comm = comm;
    start_group_api(comm);
    void **apiHandle = isColl ? &api.collApiEventHandle : &api.p2pApiEventHandle;
    int apiMask = (isColl ? ncclProfileCollApi | ncclProfileColl : ncclProfileP2pApi | ncclProfileP2p) |
                  ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin;
    if (ncclProfiler && (api.eActivationMask & apiMask)) {
        ncclProfilerEventDescr_v6_t d = {0};
        d.type = isColl ? ncclProfileCollApi : ncclProfileP2pApi;
        d.parentObj = api.groupApiEventHandle;
        if (isColl) {
            d.collApi.func = "AllReduce";
            d.collApi.count = count;
            d.collApi.datatype = "ncclFloat32";
            d.collApi.root = root;
        } else {
            d.p2pApi.func = func == ncclFuncSend ? "Send" : "Recv";
            d.p2pApi.count = count;
            d.p2pApi.datatype = "ncclFloat32";
        }
        start(comm->profilerContext, apiHandle, &d, 0);
    }
    struct task *t = &g_tasks[g_ntasks++];
    *t = (struct task){isColl, func, count, root, buff, api.eActivationMask, api.groupApiEventHandle, *apiHandle,
                       NULL};
    if (ncclProfiler && *apiHandle) {
        stop(*apiHandle, 0);
        if (!isColl) /* ncclProfilerStopP2pApiEvent clears the handle; ncclProfilerStopCollApiEvent does not */
            *apiHandle = NULL;
    }
}

static void launch(struct sim_comm *comm);

/* src/group.cc ncclGroupEndInternal, the profiler's part; the launch when the depth reaches 0 */
static void group_end_internal(void)
{
    if (api.profilerGroupDepth > 0)
        api.profilerGroupDepth--;
    if (api.profilerGroupDepth == 0 && api.state == StateStopped) {
        api.state = StateReset;
        if (ncclProfiler && api.groupApiEventHandle)
            record(api.groupApiEventHandle, ncclProfilerGroupEndApiStart, NULL, 0);
    }
    if (--ncclGroupDepth == 0 && g_ntasks)
        launch(g_group_comm);
    /* exit: ncclProfilerStopGroupApiEvent */
    if (ncclProfiler && api.groupApiEventHandle && api.profilerGroupDepth == 0) {
        stop(api.groupApiEventHandle, 0);
        api.groupApiEventHandle = NULL;
    }
}

/* src/enqueue.cc ncclEnqueueCheck */
static void enqueue(struct sim_comm *comm, bool isColl, int func, size_t count, int root, char *buff)
{
    if (api.profilerGroupDepth > 0)
        api.profilerGroupDepth++;
    ncclGroupDepth++; /* ncclGroupStartInternal */
    task_append(comm, isColl, func, count, root, buff);
    group_end_internal();
}

void sim_group_start(void) { ncclGroupDepth++; } /* src/group.cc ncclGroupStart -> ncclGroupStartInternal */

/* The group's kernel runs, and the application's stream synchronize waits for it: the proxy thread sees the
 * channels start and finish. */
static void wait_kernel(void)
{
    if (g_inline_proxy) {
        if (g_nops)
            proxy_progress(0);
        return;
    }
    pthread_mutex_lock(&g_lock);
    g_pending = g_nops > 0;
    pthread_cond_broadcast(&g_cond);
    while (g_pending)
        pthread_cond_wait(&g_cond, &g_lock);
    pthread_mutex_unlock(&g_lock);
}

void sim_group_end(void)
{
    group_end_internal();
    wait_kernel();
}

static char g_buf[3][64]; /* "device" buffers: send/recv of the all-reduces, the send, the recv */

void sim_all_reduce(struct sim_comm *comm, size_t count)
{
    enqueue(comm, true, ncclFuncAllReduce, count, 0, g_buf[0]);
    if (ncclGroupDepth == 0)
        wait_kernel(); /* an implicit group: ncclEnqueueCheck launched it */
}

void sim_send(struct sim_comm *comm, size_t count, int peer)
{
    enqueue(comm, false, ncclFuncSend, count, peer, g_buf[1]);
}

void sim_recv(struct sim_comm *comm, size_t count, int peer)
{
    enqueue(comm, false, ncclFuncRecv, count, peer, g_buf[2]);
}

/* The first task with a mask decides (ncclProfilerStartKernelLaunchEvent, ncclProfilerStartGroupEvent). */
static struct task *first_masked(void)
{
    for (int i = 0; i < g_ntasks; i++)
        if (g_tasks[i].eActivationMask)
            return &g_tasks[i];
    return NULL;
}

/* src/group.cc doLaunches -> src/enqueue.cc ncclLaunchKernel (KernelLaunch event), ncclLaunchKernelAfter_NoCuda ->
 * hostStreamPlanTask: Group start, task starts, uploadProxyOps + ncclProxyStart, task stops, Group stop. */
static void launch(struct sim_comm *comm)
{
    void *launchHandle = NULL, *groupHandle = NULL;
    struct task *m = first_masked();
    if (ncclProfiler && m && (m->eActivationMask & ncclProfileKernelLaunch)) {
        ncclProfilerEventDescr_v6_t d = {0};
        d.type = ncclProfileKernelLaunch;
        d.parentObj = m->groupApiEventHandle;
        start(comm->profilerContext, &launchHandle, &d, 0);
    }
    if (ncclProfiler && launchHandle)
        stop(launchHandle, 0);
    if (ncclProfiler && m &&
        (m->eActivationMask & (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp |
                               ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin))) {
        ncclProfilerEventDescr_v6_t d = {0};
        d.type = ncclProfileGroup;
        start(comm->profilerContext, &groupHandle, &d, 0);
    }
    /* ncclProfilerStartTaskEvents: colls (seqNumber counted for every non-persistent one), then p2p */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g_ntasks; i++) {
            struct task *t = &g_tasks[i];
            if (t->isColl != (pass == 0))
                continue;
            int own = t->isColl ? ncclProfileColl : ncclProfileP2p;
            if (ncclProfiler && (t->eActivationMask & (own | ncclProfileProxyOp | ncclProfileProxyStep |
                                                       ncclProfileKernelCh | ncclProfileNetPlugin))) {
                ncclProfilerEventDescr_v6_t d = {0};
                d.type = own;
                d.parentObj = t->apiEventHandle;
                d.rank = comm->rank;
                if (t->isColl) {
                    d.coll = (__typeof__(d.coll)){comm->seqNumber[t->func], "AllReduce", t->buff, t->buff + 32,
                                                  t->count, t->root, "ncclFloat32", NCHANNELS, 16, "RING", "SIMPLE",
                                                  groupHandle};
                } else {
                    d.p2p = (__typeof__(d.p2p)){t->func == ncclFuncSend ? "Send" : "Recv", t->buff, "ncclFloat32",
                                                t->count, t->root, NCHANNELS, groupHandle};
                }
                start(comm->profilerContext, &t->eventHandle, &d, 0);
            }
            if (t->isColl)
                __atomic_fetch_add(&comm->seqNumber[t->func], 1, __ATOMIC_RELAXED);
        }
    /* uploadProxyOps: the profiler proxy ops (src/enqueue.cc, ncclProfilerNeedsProxy), one per task channel */
    if (!g_inline_proxy)
        pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_ntasks; i++)
        if (ncclProfiler && (g_tasks[i].eActivationMask & ncclProfileKernelCh))
            for (int c = 0; c < NCHANNELS && g_nops < MAX_OPS; c++)
                g_ops[g_nops++] = (struct proxy_op){comm->profilerContext, g_tasks[i].eventHandle, NULL,
                                                    g_tasks[i].eActivationMask, (uint8_t)c};
    if (!g_inline_proxy)
        pthread_mutex_unlock(&g_lock);
    for (int pass = 0; pass < 2; pass++) /* ncclProfilerStopTaskEvents */
        for (int i = 0; i < g_ntasks; i++)
            if (g_tasks[i].isColl == (pass == 0) && ncclProfiler && g_tasks[i].eventHandle)
                stop(g_tasks[i].eventHandle, 0);
    if (ncclProfiler && groupHandle) /* ncclProfilerStopGroupEvent */
        stop(groupHandle, 0);
    g_ntasks = 0;
}
