/* The NCCL receiver's half of otel-ebpf's NCCL profiler plugin (otel_ebpf/nccl_profiler/probes.h): handlers
 * for its USDT probes, included at the end of nccl.bpf.c. The receiver (profiler.py) generates one small
 * function per probe location that reads the location's arguments (compiler-chosen operands, from the ELF
 * note) and calls the handler below; it attaches them with the probe's semaphore as reference counter, which
 * is what makes the plugin widen NCCL's activation mask.
 *
 * api_start ties the plugin's CollApi/P2pApi handle to the application call this thread is inside (the
 * uprobe's in-flight entry in `calls`): NCCL 2.28.9 starts that event in ncclEnqueueCheck, inside the call,
 * on the calling thread. The call's record carries it (nccl_coll.api / nccl_p2p.api) and so does the
 * plugin's op (rec.api = descr->parentObj): the processor joins the two on it.
 *
 * One record per op, sent when its GPU time is known: coll_start/p2p_start keep the op as NCCL planned it
 * (prof_ops, keyed by process and the op's handle) expecting rec.nchannels kernel channels; kernel_ch_start
 * maps the channel's handle to its op (prof_chs) and lowers the op's first start; kernel_ch_stop raises its
 * last stop, frees the channel's entry and, at the op's last channel, submits the op (struct nccl_prof_op)
 * and frees it. An op NCCL planned with no channel has no kernel to time and sends nothing. event_stop and
 * group_start are not attached (nothing here needs them), so the plugin does not fire them: each costs a
 * uprobe hit. NCCL's proxy thread makes every channel event of an op (src/proxy.cc,
 * ncclProfilerStartKernelChEvent/RecordKernelCh), so the counts are not atomic.
 *
 * Bounded: both maps are plain hashes; an op or channel that finds its map full is not timed and counted
 * (counters[NCCL_COUNTER_GPU_OPS_FULL / _CHS_FULL]). Entries carry their start time: the receiver's sweep
 * frees those of exited processes and those older than its limit (a hung kernel, a channel whose events were
 * lost), counted there.
 *
 * Parameters (-D): NCCL_MAX_PROF_OPS (ops whose channels are in flight), NCCL_MAX_PROF_CHS (channels).
 */
#ifndef NCCL_MAX_PROF_OPS
#define NCCL_MAX_PROF_OPS 16384
#endif
#ifndef NCCL_MAX_PROF_CHS
#define NCCL_MAX_PROF_CHS 65536
#endif

struct nccl_prof_key {
    u32 tgid;
    u32 _pad;
    u64 handle;
};

/* An op whose kernel channels are in flight: its record to be, and how many channels stopped. */
struct nccl_prof_pending {
    struct nccl_prof_op op;
    u32 expected;
    u32 stopped;
};

struct nccl_prof_channel {
    u64 op;  /* its op's handle */
    u64 ts;  /* host time of kernel_ch_start (the sweep's age) */
};

BPF_HASH(prof_ops, struct nccl_prof_key, struct nccl_prof_pending, NCCL_MAX_PROF_OPS);
BPF_HASH(prof_chs, struct nccl_prof_key, struct nccl_prof_channel, NCCL_MAX_PROF_CHS);
BPF_PERCPU_ARRAY(prof_scratch, struct nccl_prof_pending, 1); /* an op is built here: too big for the stack */

static __always_inline int nprof_comm_init(u64 context, u64 rec)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct nccl_prof_comm *e = events.ringbuf_reserve(sizeof(struct nccl_prof_comm));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = NCCL_EV_PROF_COMM;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->ts = bpf_ktime_get_ns();
    e->context = context;
    bpf_probe_read_user(&e->rec, sizeof(e->rec), (void *)rec);
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

static __always_inline int nprof_comm_finalize(u64 context)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct nccl_prof_comm_end *e = events.ringbuf_reserve(sizeof(struct nccl_prof_comm_end));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = NCCL_EV_PROF_COMM_END;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->ts = bpf_ktime_get_ns();
    e->context = context;
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

static __always_inline int nprof_api_start(u64 handle, u64 type)
{
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_call *c = calls.lookup(&id);
    if (c)
        c->api = handle;
    return 0;
}

/* coll_start / p2p_start: NCCL planned an op of `kind` (NCCL_PROF_KIND_*) described by `rec`. */
static __always_inline int nprof_op_start(u64 handle, u64 rec, u8 kind)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    int zero = 0;
    struct nccl_prof_pending *p = prof_scratch.lookup(&zero);
    if (!p)
        return 0;
    __builtin_memset(p, 0, sizeof(*p));
    p->op.type = NCCL_EV_PROF_OP;
    p->op.kind = kind;
    p->op.pid = id >> 32;
    p->op.tid = (u32)id;
    p->op.ts = bpf_ktime_get_ns();
    p->op.handle = handle;
    p->op.gpu_start = (u64)-1;
    if (kind == NCCL_PROF_KIND_COLL) {
        struct oe_nccl_coll_rec *c = (struct oe_nccl_coll_rec *)p->op.rec;
        bpf_probe_read_user(c, sizeof(*c), (void *)rec);
        p->expected = c->nchannels;
    } else {
        struct oe_nccl_p2p_rec *c = (struct oe_nccl_p2p_rec *)p->op.rec;
        bpf_probe_read_user(c, sizeof(*c), (void *)rec);
        p->expected = c->nchannels;
    }
    if (!p->expected)
        return 0; /* no kernel channel: nothing to time */
    struct nccl_prof_key k = {};
    k.tgid = id >> 32;
    k.handle = handle;
    if (prof_ops.update(&k, p) != 0)
        nccl_count(NCCL_COUNTER_GPU_OPS_FULL);
    return 0;
}

static __always_inline int nprof_coll_start(u64 handle, u64 rec)
{
    return nprof_op_start(handle, rec, NCCL_PROF_KIND_COLL);
}

static __always_inline int nprof_p2p_start(u64 handle, u64 rec)
{
    return nprof_op_start(handle, rec, NCCL_PROF_KIND_P2P);
}

static __always_inline int nprof_kernel_ch_start(u64 handle, u64 parent, u64 channel, u64 ptimer)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct nccl_prof_key k = {};
    k.tgid = tgid;
    k.handle = parent;
    struct nccl_prof_pending *p = prof_ops.lookup(&k);
    if (!p)
        return 0; /* an op of an untraced process, started before the agent attached, or not kept */
    if (ptimer < p->op.gpu_start)
        p->op.gpu_start = ptimer;
    struct nccl_prof_key ck = {};
    ck.tgid = tgid;
    ck.handle = handle;
    struct nccl_prof_channel ch = {};
    ch.op = parent;
    ch.ts = bpf_ktime_get_ns();
    if (prof_chs.update(&ck, &ch) != 0)
        nccl_count(NCCL_COUNTER_GPU_CHS_FULL);
    return 0;
}

static __always_inline int nprof_kernel_ch_stop(u64 handle, u64 ptimer)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct nccl_prof_key ck = {};
    ck.tgid = tgid;
    ck.handle = handle;
    struct nccl_prof_channel *ch = prof_chs.lookup(&ck);
    if (!ch)
        return 0;
    struct nccl_prof_key k = {};
    k.tgid = tgid;
    k.handle = ch->op;
    prof_chs.delete(&ck); /* the channel's last event we need: event_stop is not attached (its semaphore stays 0) */
    struct nccl_prof_pending *p = prof_ops.lookup(&k);
    if (!p)
        return 0;
    if (ptimer > p->op.gpu_stop)
        p->op.gpu_stop = ptimer;
    p->stopped += 1;
    if (p->stopped < p->expected)
        return 0;
    struct nccl_prof_op *e = events.ringbuf_reserve(sizeof(struct nccl_prof_op));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
    } else {
        __builtin_memcpy(e, &p->op, sizeof(*e));
        e->channels = p->stopped;
        events.ringbuf_submit(e, oe_wakeup_flags());
    }
    prof_ops.delete(&k);
    return 0;
}
