/* The NCCL receiver's half of otel-ebpf's NCCL profiler plugin (otel_ebpf/nccl_profiler/probes.h): handlers
 * for its USDT probes, included at the end of nccl.bpf.c. The receiver (profiler.py) generates one small
 * function per probe location that reads the location's arguments (compiler-chosen operands, from the ELF
 * note) and calls the handler below; it attaches them with the probe's semaphore as reference counter, which
 * is what makes the plugin widen NCCL's activation mask.
 *
 * api_start ties the plugin's CollApi/P2pApi handle to the application call this thread is inside (the
 * uprobe's in-flight entry in `calls`): NCCL 2.28.9 starts that event in ncclEnqueueCheck, inside the call,
 * on the calling thread. The call's record carries it (nccl_coll.api / nccl_p2p.api) and so does the
 * plugin's coll/p2p record (rec.api = descr->parentObj): the processor joins the two on it.
 *
 * GPU time is summed here, not per channel in Python: a collective has up to 32+ kernel channels, each a
 * start, a stop state and a stop. coll_start/p2p_start open an entry (prof_ops, keyed by process and the
 * op's handle) expecting rec.nchannels channels; kernel_ch_start maps the channel's handle to its op
 * (prof_chs) and lowers the op's first start; kernel_ch_stop raises its last stop, frees the channel's entry
 * and, at the op's last channel, submits one nccl_prof_gpu record and frees the op's. event_stop and group_start
 * are not attached (nothing here needs them), so the plugin does not fire them: each costs a uprobe hit. NCCL's proxy thread makes every channel
 * event of an op (src/proxy.cc, ncclProfilerStartKernelChEvent/RecordKernelCh), so the counts are not
 * atomic. An op whose channels never all stop (a hung kernel, fewer channels than announced) is evicted
 * from the LRU map, never reported: the processor then has no GPU time for it.
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

struct nccl_prof_op {
    u64 gpu_start;
    u64 gpu_stop;
    u32 expected;
    u32 stopped;
};

BPF_TABLE("lru_hash", struct nccl_prof_key, struct nccl_prof_op, prof_ops, NCCL_MAX_PROF_OPS);
BPF_TABLE("lru_hash", struct nccl_prof_key, u64, prof_chs, NCCL_MAX_PROF_CHS);

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

static __always_inline void nprof_open_op(u32 tgid, u64 handle, u32 nchannels)
{
    struct nccl_prof_key k = {};
    k.tgid = tgid;
    k.handle = handle;
    struct nccl_prof_op op = {};
    op.gpu_start = (u64)-1;
    op.expected = nchannels;
    if (nchannels && prof_ops.update(&k, &op) != 0)
        oe_drop(OE_DROP_STATSMAP);
}

static __always_inline int nprof_coll_start(u64 handle, u64 rec)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct nccl_prof_coll *e = events.ringbuf_reserve(sizeof(struct nccl_prof_coll));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = NCCL_EV_PROF_COLL;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->ts = bpf_ktime_get_ns();
    e->handle = handle;
    bpf_probe_read_user(&e->rec, sizeof(e->rec), (void *)rec);
    nprof_open_op(id >> 32, handle, e->rec.nchannels);
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

static __always_inline int nprof_p2p_start(u64 handle, u64 rec)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct nccl_prof_p2p *e = events.ringbuf_reserve(sizeof(struct nccl_prof_p2p));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = NCCL_EV_PROF_P2P;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->ts = bpf_ktime_get_ns();
    e->handle = handle;
    bpf_probe_read_user(&e->rec, sizeof(e->rec), (void *)rec);
    nprof_open_op(id >> 32, handle, e->rec.nchannels);
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

static __always_inline int nprof_kernel_ch_start(u64 handle, u64 parent, u64 channel, u64 ptimer)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct nccl_prof_key k = {};
    k.tgid = tgid;
    k.handle = parent;
    struct nccl_prof_op *op = prof_ops.lookup(&k);
    if (!op)
        return 0; /* an op of an untraced process, or started before the agent attached */
    if (ptimer < op->gpu_start)
        op->gpu_start = ptimer;
    struct nccl_prof_key ck = {};
    ck.tgid = tgid;
    ck.handle = handle;
    if (prof_chs.update(&ck, &parent) != 0)
        oe_drop(OE_DROP_STATSMAP);
    return 0;
}

static __always_inline int nprof_kernel_ch_stop(u64 handle, u64 ptimer)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct nccl_prof_key ck = {};
    ck.tgid = tgid;
    ck.handle = handle;
    u64 *parent = prof_chs.lookup(&ck);
    if (!parent)
        return 0;
    struct nccl_prof_key k = {};
    k.tgid = tgid;
    k.handle = *parent;
    prof_chs.delete(&ck); /* the channel's last event we need: event_stop is not attached (its semaphore stays 0) */
    struct nccl_prof_op *op = prof_ops.lookup(&k);
    if (!op)
        return 0;
    if (ptimer > op->gpu_stop)
        op->gpu_stop = ptimer;
    op->stopped += 1;
    if (op->stopped < op->expected)
        return 0;
    struct nccl_prof_gpu *e = events.ringbuf_reserve(sizeof(struct nccl_prof_gpu));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
    } else {
        __builtin_memset(e, 0, sizeof(*e));
        e->type = NCCL_EV_PROF_GPU;
        e->pid = tgid;
        e->channels = op->stopped;
        e->ts = bpf_ktime_get_ns();
        e->handle = k.handle;
        e->gpu_start = op->gpu_start;
        e->gpu_stop = op->gpu_stop;
        events.ringbuf_submit(e, oe_wakeup_flags());
    }
    prof_ops.delete(&k);
    return 0;
}

