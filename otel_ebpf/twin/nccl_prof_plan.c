/*
 * Stand-in libnccl.so.2 for the twin, part 6: the profiler's launch events, as NCCL 2.28.9 makes them.  Not
 * NVIDIA's code.  Follows src/enqueue.cc (ncclLaunchPrepare, scheduleCollTasksToPlan, scheduleP2pTasksToPlan,
 * ncclLaunchKernel, hostStreamPlanTask, uploadProxyOps), src/group.cc doLaunches and src/plugin/profiler.cc
 * (ncclProfilerStart/StopKernelLaunchEvent, Start/StopGroupEvent, Start/StopTaskEvents).
 *
 * At the outermost group end the thread's NCCL tasks become one kernel plan per communicator, the comms in
 * ascending commHash (src/include/group.h ncclGroupCommJoin), each plan holding its collectives, then its p2p:
 * - collectives in the planner's order (ncclTaskCollSorter: size bins descending, last-in first within a bin;
 *   then ncclPrepareTasks bins them by (function, device op, type) in first-seen order, last-in first within each);
 * - sends and recvs round by round of the p2p schedule (round r: send to rank + r, recv from rank - r, as
 *   src/init.cc ncclP2pSchedule orders the peers of one node), one of each per peer and round, until none is left.
 * Per plan, in doLaunches' order: KernelLaunch start, the launch, KernelLaunch stop, then hostStreamPlanTask on the
 * launching thread: Group start; per collective its Coll event (seqNumber = comm->seqNumber[func], which is
 * incremented unless the plan is captured: with a captured one only when kernel-channel events are on) and per
 * send/recv its P2p event; the kernel-channel subs go to the comm's proxy thread (uploadProxyOps); Coll/P2p stops;
 * Group stop.  The twin launches a group once, for all its comms, inside the first plan's KernelLaunch bracket.
 * A captured plan with proxy ops (kernel-channel events on, or a comm spanning nodes: the network's proxy ops)
 * runs its hostStreamPlanTask at each replay instead (a host node before the kernel, on the stream's worker).
 *
 * What NCCL's tuner would pick is the twin's own, plausible for two GPUs on one PCIe switch (TWIN_NCHANNELS):
 * collectives RING (NCCL's choice within a node for two ranks), LL below 64 KiB and SIMPLE above; channels and
 * warps by topoGetAlgoInfo's ring rule (shed channels, then threads, while nBytes < nc * nt * threshold; SIMPLE's
 * extra warp) and the channel split of scheduleCollTasksToPlan (16 KiB of traffic at least per channel), from
 * channel 0; p2p by addP2pToPlan's part sizes (a 128 KiB step, PCIe's P2P chunk) on the round's channels.
 */
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

static size_t div_up(size_t a, size_t b) { return (a + b - 1) / b; }

/* src/enqueue.cc ncclFuncTrafficPerByte */
static size_t traffic_per_byte(int func, int nranks)
{
    return func == TWIN_F_ALLREDUCE ? 2 : func == TWIN_F_ALLGATHER || func == TWIN_F_REDUCESCATTER ? (size_t)nranks : 1;
}

/* src/include/bitops.h u32fpEncode */
static uint32_t fp_encode(uint32_t x, int bits)
{
    int log2x = 31 - __builtin_clz(x | 1);
    uint32_t mantissa = x >> (log2x >= bits ? log2x - bits : 0) & ((1u << bits) - 1);
    uint32_t exponent = log2x >= bits ? (uint32_t)(log2x - (bits - 1)) : 0;
    return exponent << bits | mantissa;
}

/* ncclTaskCollSorterInsert's bin (UnitLog2 10, MaxLog2 30, 4 bins per power of 2), descending. */
static int coll_bin(const struct prof_op *o)
{
    size_t traffic = o->count * twin_type_size(o->type) * traffic_per_byte(o->func, o->comm->nranks);
    size_t max = (size_t)1 << 30;
    return 1 + (30 - 10) * 4 - 1 - (int)fp_encode((uint32_t)((traffic < max ? traffic : max) >> 10), 2);
}

/* ncclPrepareTasks' (fn, op, ty) key; the device op as hostToDevRedOp maps it (max and min: MinMax; avg: SumPostDiv
 * for integers, PreMulSum for floats; ncclRedOpCreatePreMulSum's: PreMulSum). */
static int coll_key(const struct prof_op *o)
{
    int integral = o->type != ncclFloat16 && o->type != ncclBfloat16 && o->type != ncclFloat32 && o->type != ncclFloat64
                   && o->type != ncclFloat8e4m3 && o->type != ncclFloat8e5m2;
    int dev = o->op == ncclSum ? 0 : o->op == ncclProd ? 1 : o->op == ncclMax || o->op == ncclMin ? 2
            : o->op == ncclAvg ? (integral ? 4 : 3) : 3;
    return (o->func * 5 + dev) * 64 + (int)o->type;
}

/* in[0..k) (append order) -> out, the planner's order of collectives. */
static void order_colls(const struct prof_op *ops, const int *in, int k, int *out, int *scratch)
{
    int m = 0;
    for (int i = 0; i < k; i++) { /* the sorter: bin ascending, later first within a bin */
        int j = i, v = in[i], b = coll_bin(&ops[v]);
        for (; j > 0 && coll_bin(&ops[scratch[j - 1]]) >= b; j--)
            scratch[j] = scratch[j - 1];
        scratch[j] = v;
    }
    for (int i = 0; i < k; i++) { /* (fn, op, ty) groups in first-seen order, each reversed */
        int key, first = m;
        if (scratch[i] < 0)
            continue;
        key = coll_key(&ops[scratch[i]]);
        for (int j = i; j < k; j++)
            if (scratch[j] >= 0 && coll_key(&ops[scratch[j]]) == key) {
                out[m++] = scratch[j];
                scratch[j] = -1;
            }
        for (int a = first, b = m - 1; a < b; a++, b--) {
            int t = out[a];
            out[a] = out[b];
            out[b] = t;
        }
    }
}

static int first_of(const struct prof_op *ops, int *in, int k, int func, int peer)
{
    for (int i = 0; i < k; i++)
        if (in[i] >= 0 && ops[in[i]].func == func && ops[in[i]].peer == peer) {
            int v = in[i];
            in[i] = -1;
            return v;
        }
    return -1;
}

/* scheduleP2pTasksToPlan: round by round, the next send to rank + r, then the next recv from rank - r. */
static void order_p2p(const struct prof_op *ops, int *in, int k, int *out, int rank, int nranks)
{
    for (int m = 0; m < k;)
        for (int r = 0; r < nranks && m < k; r++) {
            int s = first_of(ops, in, k, TWIN_F_SEND, (rank + r) % nranks);
            int v = first_of(ops, in, k, TWIN_F_RECV, (rank - r + nranks) % nranks);
            if (s >= 0)
                out[m++] = s;
            if (v >= 0)
                out[m++] = v;
        }
}

static void tune_coll(struct prof_op *o)
{
    size_t nbytes = o->count * twin_type_size(o->type)
                    * (o->func == TWIN_F_ALLGATHER || o->func == TWIN_F_REDUCESCATTER ? (size_t)o->comm->nranks : 1);
    int ll = nbytes < (64 << 10), threshold = ll ? 8 : 64, nt = 512, nc = TWIN_NCHANNELS;
    size_t traffic = nbytes * (o->func == TWIN_F_ALLREDUCE ? 2 : 1) * (ll ? 4 : 1), per, n;
    while (nbytes < (size_t)nc * nt * threshold && nc >= 2)
        nc--;
    while (nbytes < (size_t)nc * nt * threshold && nt % 128 == 0)
        nt /= 2;
    nt += ll ? 0 : 32;
    nt = nt / 32 < 3 ? 96 : nt;
    per = traffic / (size_t)nc > (16 << 10) ? traffic / (size_t)nc : (16 << 10);
    n = div_up(traffic, per);
    o->nch = (uint8_t)(n < 1 ? 1 : n < (size_t)nc ? n : (size_t)nc);
    o->nwarps = (uint8_t)(nt / 32);
    o->algo = "RING";
    o->proto = ll ? "LL" : "SIMPLE";
    o->chan0 = 0;
}

static void tune_p2p(struct prof_op *o)
{
    struct ncclComm *c = o->comm;
    size_t bytes = o->count * twin_type_size(o->type), step = 128 << 10;
    size_t min_part = c->prof.nnodes > 1 ? step / 2 : step / 8, max_part = c->prof.nnodes > 1 ? step : step * 32, part;
    int nmin = TWIN_NCHANNELS, nmax = TWIN_NCHANNELS, n = 1;
    int round = o->func == TWIN_F_SEND ? (o->peer - c->rank + c->nranks) % c->nranks
                                       : (c->rank - o->peer + c->nranks) % c->nranks;
    while (nmin * c->nranks > TWIN_NCHANNELS && nmin > 1)
        nmin /= 2;
    if (bytes > 0) {
        n = div_up(bytes, min_part) < (size_t)nmin ? (int)div_up(bytes, min_part) : nmin;
        part = div_up(bytes, (size_t)n) > min_part ? div_up(bytes, (size_t)n) : min_part;
        while (part > max_part && n <= nmax / 2) {
            n *= 2;
            part = div_up(bytes, (size_t)n);
        }
    }
    o->nch = (uint8_t)n;
    /* ncclP2pChannelBaseForRound within a node: reverseBits(round, log2Up(p2pnChannels)) */
    o->chan0 = (uint8_t)(TWIN_NCHANNELS == 2 ? (round & 1) : 0);
}

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
    order_colls(ops, in, k, order, scratch);
    p.ncoll = k;
    k = 0;
    for (int i = 0; i < n; i++)
        if (ops[i].comm == c && twin_is_p2p(ops[i].func))
            in[k++] = i;
    order_p2p(ops, in, k, order + p.ncoll, c->rank, c->nranks);
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
            tune_p2p(o);
        else
            tune_coll(o);
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
