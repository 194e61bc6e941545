/*
 * Stand-in libnccl.so.2 for the twin, part 7: the profiler's launch events, as NCCL 2.28.9 makes them.  Not
 * NVIDIA's code.  Follows src/enqueue.cc (ncclLaunchPrepare, ncclLaunchKernel, hostStreamPlanTask, uploadProxyOps),
 * src/group.cc doLaunches and src/plugin/profiler.cc (ncclProfilerStart/StopKernelLaunchEvent, Start/StopGroupEvent,
 * Start/StopTaskEvents).
 *
 * At the outermost group end the thread's NCCL tasks become one kernel plan per communicator, the comms in
 * ascending commHash (src/include/group.h ncclGroupCommJoin), each plan holding its collectives, then its p2p, in
 * the planner's order and with what the twin's tuner picks (nccl_prof_order.c).  Per plan, in doLaunches' order:
 * KernelLaunch start, the launch, KernelLaunch stop, then hostStreamPlanTask on the launching thread: Group start;
 * per collective its Coll event (seqNumber = comm->seqNumber[func], which is incremented unless the plan is
 * captured: with a captured one only when kernel-channel events are on) and per send/recv its P2p event; the
 * kernel-channel subs go to the comm's proxy thread (uploadProxyOps); Coll/P2p stops; Group stop.  The twin
 * launches a group once, for all its comms, inside the first plan's KernelLaunch bracket.  A captured plan with
 * proxy ops (kernel-channel events on, or a comm spanning nodes: the network's proxy ops) runs its
 * hostStreamPlanTask at each replay instead (a host node before the kernel, on the stream's worker).
 *
 * Known difference from NCCL 2.28.9: an uncaptured plan's hostStreamPlanTask always runs on the launching thread;
 * NCCL moves it to a host callback on its host stream under CUDA_LAUNCH_BLOCKING, or while graphs of the comm are
 * alive and that stream still has work (ncclLaunchPrepare: persistentRefs, serialEvent not ready). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "nccl_prof.h"

#define GROUP_MASK (ncclProfileGroup | ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep \
                    | ncclProfileKernelCh | ncclProfileNetPlugin)
#define COLL_MASK (ncclProfileColl | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh \
                   | ncclProfileNetPlugin)
#define P2P_MASK (ncclProfileP2p | ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh \
                  | ncclProfileNetPlugin)
#define KERNEL_CH(op) (twin_profiler != NULL && ((op)->mask & ncclProfileKernelCh)) /* devWork.profilerEnabled */

/* ncclProxyOp.workCounter: ++comm->profiler.workCounter[channel], per channel of the task (incWorkCounter). */
static void assign_wc(struct prof_op *o)
{
    for (int i = 0; i < o->nch; i++)
        o->wc[i] = __atomic_add_fetch(&o->comm->prof.wc[twin_channel_of(o, i)], 1, __ATOMIC_RELAXED);
}

/* The plans of comm `c`: ops of c in plan order appended to out; returns the plan. */
static struct prof_plan make_plan(struct prof_op *ops, int n, struct ncclComm *c, struct prof_op *out, int at)
{
    struct prof_plan p = { .first = at };
    int *in = malloc(sizeof(int) * 3 * (size_t)n), *order = in + n, *scratch = order + n, k = 0, seen = 0;
    if (in == NULL)
        return p;
    for (int i = 0; i < n; i++)
        if (ops[i].comm == c && !twin_is_p2p(ops[i].func))
            in[k++] = i;
    twin_prof_order_colls(ops, in, k, order, scratch);
    p.ncoll = k;
    k = 0;
    for (int i = 0; i < n; i++)
        if (ops[i].comm == c && twin_is_p2p(ops[i].func))
            in[k++] = i;
    twin_prof_order_p2p(ops, in, k, order + p.ncoll, c->rank, c->nranks);
    p.np2p = k;
    for (int i = 0; i < n; i++) { /* planner->streams: each new stream pushed in front */
        int fresh = ops[i].comm == c;
        for (int j = 0; j < i && fresh; j++)
            fresh = !(ops[j].comm == c && ops[j].stream == ops[i].stream);
        if (fresh) {
            p.stream = ops[i].stream;
            p.persistent = seen++ ? p.persistent : ops[i].captured;
        }
    }
    p.proxy = c->prof.nnodes > 1;
    for (int i = 0; i < p.ncoll + p.np2p; i++) {
        struct prof_op *o = &out[at + i];
        *o = ops[order[i]];
        if (twin_is_p2p(o->func))
            twin_prof_tune_p2p(o);
        else
            twin_prof_tune_coll(o);
        p.proxy |= KERNEL_CH(o);
        if (KERNEL_CH(o) && twin_prof_proxy_of(c) != NULL && !p.persistent)
            assign_wc(o);
    }
    free(in);
    return p;
}

void twin_prof_group_free(struct twin_prof_group *g)
{
    if (g != NULL) {
        free(g->ops);
        free(g->plans);
        free(g);
    }
}

static struct twin_prof_group *copy_group(const struct twin_prof_group *g)
{
    struct twin_prof_group *c = calloc(1, sizeof(*c));
    if (c == NULL || (c->ops = malloc(sizeof(*c->ops) * (size_t)g->nops)) == NULL
        || (c->plans = malloc(sizeof(*c->plans) * (size_t)g->nplans)) == NULL) {
        twin_prof_group_free(c);
        return NULL;
    }
    c->nops = g->nops;
    c->nplans = g->nplans;
    memcpy(c->ops, g->ops, sizeof(*c->ops) * (size_t)g->nops);
    memcpy(c->plans, g->plans, sizeof(*c->plans) * (size_t)g->nplans);
    return c;
}

/* What the stream engine needs: where to write each kernel-channel's start and end, and a captured group's plans. */
static struct twin_prof_job *make_job(const struct twin_prof_group *g)
{
    struct twin_prof_job *job;
    int n = 0, deferred = 0, k = 0;
    for (int i = 0; i < g->nplans; i++)
        deferred |= g->plans[i].persistent && g->plans[i].proxy;
    for (int i = 0; i < g->nops; i++)
        n += KERNEL_CH(&g->ops[i]) ? g->ops[i].nch : 0;
    if (n == 0 && !deferred)
        return NULL;
    if ((job = calloc(1, sizeof(*job) + sizeof(job->stamps[0]) * (size_t)n)) == NULL)
        return NULL;
    for (int i = 0; i < g->nops; i++)
        for (int c = 0; KERNEL_CH(&g->ops[i]) && c < g->ops[i].nch; c++)
            job->stamps[k++] = (struct prof_stamp){ .task = g->ops[i].task, .op = i, .comm = g->ops[i].comm,
                                                    .ch = twin_channel_of(&g->ops[i], c), .chi = (uint8_t)c,
                                                    .wc = g->ops[i].wc[c] };
    job->nstamps = n;
    job->replay = deferred ? copy_group(g) : NULL;
    return job;
}

struct twin_prof_group *twin_prof_prepare(struct twin_prof_job **job)
{
    struct twin_prof_group *g;
    struct prof_op *ops;
    int nops, at = 0;
    *job = NULL;
    ops = twin_prof_take(&nops);
    if (nops == 0 || (g = calloc(1, sizeof(*g))) == NULL) {
        free(ops);
        return NULL;
    }
    g->ops = malloc(sizeof(*g->ops) * (size_t)nops);
    g->plans = malloc(sizeof(*g->plans) * (size_t)nops);
    if (g->ops == NULL || g->plans == NULL) {
        free(ops);
        twin_prof_group_free(g);
        return NULL;
    }
    while (at < nops) { /* the comm with the least commHash not planned yet */
        struct ncclComm *next = NULL;
        for (int i = 0; i < nops; i++) {
            int done = 0;
            for (int p = 0; p < g->nplans && !done; p++)
                done = g->ops[g->plans[p].first].comm == ops[i].comm;
            if (!done && (next == NULL || ops[i].comm->prof.hash < next->prof.hash))
                next = ops[i].comm;
        }
        g->plans[g->nplans] = make_plan(ops, nops, next, g->ops, at);
        if (g->plans[g->nplans].ncoll + g->plans[g->nplans].np2p == 0)
            break; /* out of memory */
        at += g->plans[g->nplans].ncoll + g->plans[g->nplans].np2p;
        g->nplans++;
    }
    g->nops = at;
    free(ops);
    *job = make_job(g);
    return g;
}

/* The first task in plan order (collectives, then p2p) with a mask: its mask and group API handle rule the plan. */
static const struct prof_op *plan_head(const struct twin_prof_group *g, const struct prof_plan *p)
{
    for (int i = p->first; i < p->first + p->ncoll + p->np2p; i++)
        if (g->ops[i].mask != 0)
            return &g->ops[i];
    return NULL;
}

/* ncclProfilerStartKernelLaunchEvent */
static void launch_start(struct twin_prof_group *g, struct prof_plan *p)
{
    const struct prof_op *h = plan_head(g, p);
    ncclProfilerEventDescr_v5_t d;
    if (twin_profiler == NULL || h == NULL || !(h->mask & ncclProfileKernelLaunch))
        return;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileKernelLaunch;
    d.parentObj = h->group_api;
    d.kernelLaunch.stream = (void *)p->stream;
    twin_profiler->startEvent(g->ops[p->first].comm->prof.ctx, &p->launch_event, &d);
}

static void launch_stop(struct prof_plan *p)
{
    if (twin_profiler != NULL && p->launch_event != NULL)
        twin_profiler->stopEvent(p->launch_event);
}

static void coll_start(struct prof_plan *p, struct prof_op *o)
{
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileColl;
    d.coll.parentGroup = p->group_event;
    d.parentObj = o->api;
    d.rank = o->comm->rank;
    d.coll.seqNumber = o->comm->prof.seq[o->func];
    d.coll.func = twin_func_name(o->func);
    d.coll.sendBuff = o->send;
    d.coll.recvBuff = o->recv;
    d.coll.count = o->count;
    d.coll.root = o->peer;
    d.coll.datatype = twin_type_name(o->type);
    d.coll.nChannels = o->nch;
    d.coll.nWarps = o->nwarps;
    d.coll.algo = o->algo;
    d.coll.proto = o->proto;
    twin_profiler->startEvent(o->comm->prof.ctx, &o->event, &d);
}

static void p2p_start(struct prof_plan *p, struct prof_op *o)
{
    ncclProfilerEventDescr_v5_t d;
    memset(&d, 0, sizeof(d));
    d.type = ncclProfileP2p;
    d.p2p.parentGroup = p->group_event;
    d.parentObj = o->api;
    d.rank = o->comm->rank;
    d.p2p.func = twin_func_name(o->func);
    d.p2p.buff = o->recv;
    d.p2p.count = o->count;
    d.p2p.datatype = twin_type_name(o->type);
    d.p2p.peer = o->peer;
    d.p2p.nChannels = o->nch;
    twin_profiler->startEvent(o->comm->prof.ctx, &o->event, &d);
}

/* hostStreamPlanTask's profiler part (p->persistent: the plan is a graph's). */
void twin_prof_plan_task(struct twin_prof_group *g, struct prof_plan *p)
{
    const struct prof_op *h = plan_head(g, p);
    struct prof_op *ops = &g->ops[p->first];
    struct ncclComm *c = ops[0].comm;
    ncclProfilerEventDescr_v5_t d;
    if (twin_profiler != NULL && h != NULL && (h->mask & GROUP_MASK)) { /* ncclProfilerStartGroupEvent */
        memset(&d, 0, sizeof(d));
        d.type = ncclProfileGroup;
        twin_profiler->startEvent(c->prof.ctx, &p->group_event, &d);
    }
    for (int i = 0; i < p->ncoll; i++) { /* ncclProfilerStartTaskEvents */
        struct prof_op *o = &ops[i];
        if (twin_profiler != NULL && (o->mask & COLL_MASK))
            coll_start(p, o);
        if (!p->persistent || (twin_profiler != NULL && (p->group_event || o->api) && (o->mask & ncclProfileKernelCh)))
            __atomic_fetch_add(&c->prof.seq[o->func], 1, __ATOMIC_RELAXED);
    }
    for (int i = p->ncoll; twin_profiler != NULL && i < p->ncoll + p->np2p; i++)
        if (ops[i].mask & P2P_MASK)
            p2p_start(p, &ops[i]);
    for (int i = 0; i < p->ncoll + p->np2p; i++) /* uploadProxyOps */
        if (KERNEL_CH(&ops[i]))
            twin_prof_proxy_post(&ops[i]);
    for (int i = 0; twin_profiler != NULL && i < p->ncoll + p->np2p; i++) /* ncclProfilerStopTaskEvents */
        if (ops[i].event != NULL)
            twin_profiler->stopEvent(ops[i].event);
    if (twin_profiler != NULL && p->group_event != NULL)
        twin_profiler->stopEvent(p->group_event);
}

void twin_prof_launch_begin(struct twin_prof_group *g)
{
    if (g != NULL && g->nplans > 0)
        launch_start(g, &g->plans[0]);
}

void twin_prof_launch_end(struct twin_prof_group *g, int launched, int persistent)
{
    for (int i = 0; g != NULL && i < g->nplans; i++) {
        struct prof_plan *p = &g->plans[i];
        if (i > 0 && launched)
            launch_start(g, p);
        launch_stop(p);
        if (!launched)
            break; /* ncclLaunchKernel failed: doLaunches stops */
        p->persistent = persistent;
        if (!(persistent && p->proxy)) /* a captured plan with proxy ops: at each replay (isHostCbEnq) */
            twin_prof_plan_task(g, p);
    }
    twin_prof_group_free(g);
}

void twin_prof_replay(struct twin_prof_job *job)
{
    struct twin_prof_group *g = job != NULL ? job->replay : NULL;
    for (int s = 0; g != NULL && s < job->nstamps; s++)
        job->stamps[s].started = job->stamps[s].stopped = 0;
    for (int i = 0; g != NULL && i < g->nplans; i++) {
        struct prof_plan *p = &g->plans[i];
        if (!(p->persistent && p->proxy))
            continue;
        for (int k = p->first; k < p->first + p->ncoll + p->np2p; k++) /* SaveProxyProfiler: persistent plans */
            if (KERNEL_CH(&g->ops[k]))
                assign_wc(&g->ops[k]);
        for (int s = 0; s < job->nstamps; s++)
            if (job->stamps[s].op >= p->first && job->stamps[s].op < p->first + p->ncoll + p->np2p)
                job->stamps[s].wc = g->ops[job->stamps[s].op].wc[job->stamps[s].chi];
        twin_prof_plan_task(g, p);
    }
}

/* Collectives appended while no plugin was loaded still count (comm->seqNumber "used by RAS as well"). */
void twin_prof_seq(const struct twin_task *tasks, int n, int persistent)
{
    for (int i = 0; i < n && !persistent; i++) {
        const struct twin_task *t = &tasks[i];
        if (t->kind == TWIN_COLL && t->prof_ops == 0 && t->func != TWIN_F_ALLTOALL && t->count > 0
            && t->comm->nranks > 1)
            __atomic_fetch_add(&t->comm->prof.seq[t->func], 1, __ATOMIC_RELAXED);
    }
}
