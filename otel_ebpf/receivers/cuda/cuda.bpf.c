/* CUDA runtime (libcudart.so.12) uprobes. Prepended with otel_ebpf/bpf/include/common.bpf.c.
 *
 * - Completed calls (memcpy, malloc/free, synchronize, cudaSetDevice, cudaGraphLaunch): the uprobe saves the
 *   arguments in `inflight`, keyed by (tid, api) so one API nested in another on the same
 *   thread keeps both; the uretprobe pairs it, emits ONE record with start/end/rc, and deletes
 *   the entry. A full `inflight` is counted in drops[OE_DROP_STATEMAP]. Entries of threads that
 *   die inside a call are removed at thread exit.
 * - Call accounting (memcpy, synchronize, graph launch): at return every call is added to `call_stats`, keyed
 *   by {pid, api, device, rc, memcpy kind}: calls, summed duration and bytes, and duration and
 *   byte histograms whose bucket bounds come from Python (-DCUDA_DUR_BOUNDS_NS, the emitter's
 *   latency bounds; -DCUDA_BYTES_BOUNDS, its powers of four). The metrics of these calls are
 *   read from this map, so they stay exact whatever happens to the records. With
 *   CUDA_SPAN_RATE = R > 0 a per-process token bucket (R per second, burst R) decides which of
 *   these calls also get a record (a span); calls of at least CUDA_SPAN_SLOW_NS always do. The
 *   others are counted in `limited`. The bucket is not atomic across threads of one process:
 *   under contention it may admit slightly more or fewer than R per second; the counts are exact.
 * - Kernel launches (cudaLaunchKernel, cudaLaunchKernelExC): entry only, so the cost lands on
 *   the caller and no uretprobe trampoline runs. Counted per {pid, device, grid size, block
 *   size} in a per-CPU hash that Python reads every stats interval (a full map is counted in
 *   drops[OE_DROP_STATSMAP]). With CUDA_LAUNCH_SAMPLE_EVERY = N > 0, every Nth launch of a
 *   process also emits a cuda_launch_rec.
 * - The thread's device (cuda.device) comes from `thread_device`, written when cudaSetDevice
 *   returns 0 (CUDA's current device is per host thread). A thread that never set one is on
 *   device 0, CUDA's default (CUDA Runtime API 13.0, cudaSetDevice): PyTorch skips cudaSetDevice
 *   when the thread is already on the device it wants, so LOCAL_RANK 0 never calls it. A thread
 *   that set its device before the agent attached is learned from a cudaGetDevice return, probed
 *   only for a window after such an attach (get_device_enter).
 * - Nesting (OE_THREAD_CTX, common.bpf.c): each call's entry reads the thread's innermost open
 *   Python function / PyTorch operator from oe_thread_ctx (written by the python and torch
 *   programs of the same agent) and its record carries it (ctx_kind, ctx_start, ctx_root).
 *   With CUDA_LAUNCH_CONTEXT=1 launches read it too: the operator's entry address joins the
 *   launch counter key (so the counts are per operator) and sampled launches carry it.
 *
 * - Stream capture: cudaStreamBeginCapture* and cudaStreamEndCapture* are counted, and the thread that began a
 *   capture has it open in oe_thread_ctx.capture (common.bpf.c; shared with the nccl program) until the capture
 *   ends, on whatever thread ends it (capture_streams says which thread began it). Every launch and call the
 *   thread makes meanwhile is marked `captured`: recorded into a graph, not run (it runs at each cudaGraphLaunch,
 *   counted there). Per thread, not per stream: a launch on another, non-capturing stream from that thread is
 *   marked too (CUDA allows it; PyTorch's torch.cuda.graph launches only on the capture stream and the streams that
 *   joined it). A launch reads the thread's entry only while some capture is open (capture_open).
 * - Kernel names: with CUDA_LAUNCH_FUNC=1 the launched function (`func`) is part of the launch counter key, and
 *   the calls that make kernel handles (__cudaGetKernel, cudaGetFuncBySymbol, cuModuleGetFunction,
 *   cuLibraryGetKernel) give a record each tying the handle to a host function or a name (kernel_return).
 *
 * Parameters (-D): CUDA_MAX_INFLIGHT, CUDA_MAX_THREADS, CUDA_MAX_LAUNCH_KEYS, CUDA_MAX_CAPTURES,
 * CUDA_LAUNCH_SAMPLE_EVERY, CUDA_CALL_CONTEXT, CUDA_LAUNCH_CONTEXT, CUDA_LAUNCH_FUNC, CUDA_MAX_CALL_KEYS, CUDA_SPAN_RATE,
 * CUDA_SPAN_SLOW_NS, CUDA_DUR_BOUNDS_NS + CUDA_DUR_NBOUNDS, CUDA_BYTES_BOUNDS + CUDA_BYTES_NBOUNDS.
 */
#include "cuda.h"

#ifndef CUDA_MAX_INFLIGHT
#define CUDA_MAX_INFLIGHT 16384
#endif
#ifndef CUDA_MAX_THREADS
#define CUDA_MAX_THREADS 65536
#endif
#ifndef CUDA_MAX_LAUNCH_KEYS
#define CUDA_MAX_LAUNCH_KEYS 4096
#endif
#ifndef CUDA_LAUNCH_SAMPLE_EVERY
#define CUDA_LAUNCH_SAMPLE_EVERY 0
#endif
#ifndef CUDA_MAX_CALL_KEYS
#define CUDA_MAX_CALL_KEYS 4096
#endif
#ifndef CUDA_SPAN_RATE
#define CUDA_SPAN_RATE 0
#endif
#ifndef CUDA_SPAN_SLOW_NS
#define CUDA_SPAN_SLOW_NS 0
#endif
#if !defined(CUDA_DUR_BOUNDS_NS) || !defined(CUDA_BYTES_BOUNDS)
#error "CUDA_DUR_BOUNDS_NS and CUDA_BYTES_BOUNDS come from otel_ebpf/receivers/cuda/receiver.py"
#endif
#ifndef OE_THREAD_CTX
#error "the cuda program keeps stream captures in oe_thread_ctx: it is compiled with OE_THREAD_CTX"
#endif
#ifndef CUDA_CALL_CONTEXT
#define CUDA_CALL_CONTEXT 0 /* 1: a python or torch program writes oe_thread_ctx's call slots: calls read them */
#endif
#if !CUDA_CALL_CONTEXT
#undef CUDA_LAUNCH_CONTEXT
#define CUDA_LAUNCH_CONTEXT 0
#endif
#ifndef CUDA_LAUNCH_CONTEXT
#define CUDA_LAUNCH_CONTEXT 1
#endif
#ifndef CUDA_MAX_CAPTURES
#define CUDA_MAX_CAPTURES 4096
#endif
#ifndef CUDA_LAUNCH_FUNC
#define CUDA_LAUNCH_FUNC 1
#endif

struct cuda_call_key {
    u32 tid;
    u32 api;
};

struct cuda_call_state {
    u64 start_ns;
    u64 arg[5];
    u64 ctx_start;   /* the enclosing call (oe_thread_ctx) at entry; 0: none */
    u64 ctx_root;
    u32 ctx_kind;
    u32 _pad;
};

struct cuda_launch_key {
    u32 pid;
    s16 device;      /* a device index (cudaSetDevice's int; 16 bits keep the key small: hashed per launch) */
    u8 api;          /* CUDA_API_* of the entry point that counted it (runtime or driver) */
    u8 captured;     /* 1: recorded into a graph during a stream capture, not run */
    u64 grid_size;   /* blocks: grid.x * grid.y * grid.z */
    u64 block_size;  /* threads per block: block.x * block.y * block.z */
    u64 op;          /* entry address of the enclosing PyTorch operator; 0: none (or not read) */
    u64 func;        /* the launched kernel (CUDA_LAUNCH_FUNC): host function, cudaKernel_t or CUfunction; 0: off */
};

/* What a launch entry probe decoded. */
struct cuda_launch_args {
    u64 func;
    u32 grid[3];
    u32 block[3];
    u64 shared_mem;
    u64 stream;
};

/* cudaLaunchConfig_t (CUDA 12): grid@0 block@12 dynamicSmemBytes@24 stream@32 (attrs@40,
 * numAttrs@48 not read). */
struct cuda_launch_config {
    u32 grid[3];
    u32 block[3];
    u64 shared_mem;
    u64 stream;
};

/* Call accounting of memcpy and synchronize calls (see the top of this file). */
struct cuda_call_stats_key {
    u32 pid;
    s32 device;
    s32 rc;
    u8 api;
    u8 kind;         /* cudaMemcpyKind; 0 for synchronize */
    u8 captured;     /* as in cuda_call */
    u8 _pad;
};

struct cuda_call_stats {
    u64 calls;
    u64 limited;     /* calls the span rate limit gave no record */
    u64 dur_ns;      /* summed durations */
    u64 bytes;       /* summed bytes (memcpy) */
    u64 dur_hist[CUDA_DUR_NBOUNDS + 1];
    u64 bytes_hist[CUDA_BYTES_NBOUNDS + 1];
};

/* Per-process span budget, in nanoseconds of credit: a span costs 1e9 / CUDA_SPAN_RATE. */
struct cuda_span_budget {
    u64 credit_ns;
    u64 last_ns;
};

BPF_HASH(inflight, struct cuda_call_key, struct cuda_call_state, CUDA_MAX_INFLIGHT);
BPF_HASH(call_stats, struct cuda_call_stats_key, struct cuda_call_stats, CUDA_MAX_CALL_KEYS);
BPF_PERCPU_ARRAY(call_stats_zero, struct cuda_call_stats, 1); /* never written: the insert value */
#if CUDA_SPAN_RATE > 0
BPF_HASH(span_budget, u32, struct cuda_span_budget, OE_MAX_PIDS);
#endif
/* Per traced thread: its device, and the address of the runtime launch function (cudaLaunchKernel*) it
 * last entered that has not reached the driver yet. The next driver launch (cuLaunchKernel*) of the thread
 * consumes the mark and, when it was called from within CUDA_RT_SPAN bytes of that address (from inside that
 * libcudart), is the runtime's own call into the driver, already counted (driver_launch_enter). Kept in the
 * launch path's one lookup, so the runtime launch pays one store (a clock read measured +90 ns a launch). */
struct cuda_thread {
    s32 device;
    u32 known;       /* 1: device set (cudaSetDevice) or learned (cudaGetDevice); 0: CUDA's default, assumed */
    u64 rt_launch_ip;
};
BPF_HASH(thread_device, u32, struct cuda_thread, CUDA_MAX_THREADS);
BPF_PERCPU_ARRAY(thread_scratch, struct cuda_thread, 1);
BPF_PERCPU_HASH(launch_stats, struct cuda_launch_key, u64, CUDA_MAX_LAUNCH_KEYS);
/* Stream captures open now: which thread began each, so the thread that ends it (maybe another one) can close
 * it. Keyed by stream; a per-thread stream handle (NULL under _ptsz, cudaStreamPerThread) names the calling
 * thread's own stream, so its key carries the thread. LRU: a capture whose end was never seen (the process died
 * in it) is evicted, not kept. */
struct cuda_capture_key {
    u32 pid;
    u32 tid;     /* 0 unless the stream handle is a per-thread one */
    u64 stream;
};
BPF_TABLE("lru_hash", struct cuda_capture_key, u32, capture_streams, CUDA_MAX_CAPTURES);
/* Open captures of traced threads (a hint, never exact after a missed end: it only chooses the launch path). */
BPF_ARRAY(capture_open, s64, 1);
#if CUDA_LAUNCH_SAMPLE_EVERY > 0
BPF_HASH(launch_seq, u32, u64, OE_MAX_PIDS);
#endif

/* 1 when thread `tid` has a stream capture open: its launches and calls are recorded into a graph. */
static __always_inline int capture_any_open(void)
{
    int zero = 0;
    s64 *open = capture_open.lookup(&zero);
    return open && *open > 0;
}

static __always_inline u8 cuda_captured(u32 tid)
{
    return capture_any_open() && oe_capture_depth(tid) > 0;
}

static __always_inline s32 cuda_device(u32 tid)
{
    struct cuda_thread *t = thread_device.lookup(&tid);
    return t ? t->device : 0; /* never set: CUDA's default device */
}

/* The launch path's one lookup: a thread_device entry exists only for threads of traced
 * processes, so finding it answers both "traced?" and "which device?". A traced thread seen
 * for the first time gets an entry (device 0 until cudaSetDevice succeeds); a full map only
 * costs the two-lookup path next time. Entries go at thread exit. Returns 0: not traced. */
static __always_inline struct cuda_thread *launch_thread(u64 id, s32 *device)
{
    u32 tid = (u32)id;
    struct cuda_thread *t = thread_device.lookup(&tid);
    if (t) {
        *device = t->device;
        return t;
    }
    if (!oe_is_traced(id >> 32))
        return NULL;
    struct cuda_thread dflt = {};
    thread_device.insert(&tid, &dflt);
    *device = 0;
    t = thread_device.lookup(&tid);
    if (t)
        return t;
    int zero = 0;
    return thread_scratch.lookup(&zero); /* a full map: traced, but the mark is kept in per-CPU scratch */
}

/* ---- completed calls -------------------------------------------------------------- */

static __always_inline int cuda_enter(struct pt_regs *ctx, u32 api)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct cuda_call_key key = {};
    key.tid = (u32)id;
    key.api = api;
    struct cuda_call_state st = {};
    st.start_ns = bpf_ktime_get_ns();
    st.arg[0] = PT_REGS_PARM1(ctx);
    st.arg[1] = PT_REGS_PARM2(ctx);
    st.arg[2] = PT_REGS_PARM3(ctx);
    st.arg[3] = PT_REGS_PARM4(ctx);
    st.arg[4] = PT_REGS_PARM5(ctx);
#if CUDA_CALL_CONTEXT
    u64 op = 0;
    st.ctx_kind = oe_ctx_get(key.tid, &st.ctx_start, &st.ctx_root, &op);
#endif
    if (inflight.update(&key, &st) != 0)
        oe_drop(OE_DROP_STATEMAP);
    return 0;
}

static __always_inline void cuda_fill(struct cuda_call *c, u8 type, u32 api,
                                      struct cuda_call_state *st, struct pt_regs *ctx, u64 end_ns)
{
    u64 id = bpf_get_current_pid_tgid();
    c->type = type;
    c->api = api;
    c->pid = id >> 32;
    c->tid = (u32)id;
    c->device = cuda_device((u32)id);
    c->start_ns = st->start_ns;
    c->end_ns = end_ns;
    c->rc = (s32)PT_REGS_RC(ctx);
    c->ctx_kind = (u8)st->ctx_kind;
    c->captured = cuda_captured((u32)id);
    c->ctx_start = st->ctx_start;
    c->ctx_root = st->ctx_root;
}

/* ---- call accounting and the span budget (memcpy, synchronize) --------------------- */

/* name(v): the bucket of `v` for BOUNDS b[0] < b[1] < ...: the number of bounds below v, i.e.
 * the first i with v <= b[i] (OTel explicit-bucket semantics; Python's bisect_left). */
#define CUDA_BUCKET_FN(name, BOUNDS, NBOUNDS)                                              \
    static __always_inline u32 name(u64 v)                                                 \
    {                                                                                      \
        u64 b[] = {BOUNDS};                                                                \
        u32 i = 0;                                                                         \
        _Pragma("unroll") for (u32 j = 0; j < NBOUNDS; j++) if (v > b[j]) i = j + 1;       \
        return i;                                                                          \
    }

CUDA_BUCKET_FN(dur_bucket, CUDA_DUR_BOUNDS_NS, CUDA_DUR_NBOUNDS)
CUDA_BUCKET_FN(bytes_bucket, CUDA_BYTES_BOUNDS, CUDA_BYTES_NBOUNDS)

/* 1: this call gets a record (span); 0: the process is over its span rate. */
static __always_inline int span_allowed(u32 pid, u64 now, u64 dur)
{
#if CUDA_SPAN_RATE > 0
    const u64 cost = 1000000000ULL / CUDA_SPAN_RATE, burst = 1000000000ULL;
    if (CUDA_SPAN_SLOW_NS > 0 && dur >= CUDA_SPAN_SLOW_NS)
        return 1;
    struct cuda_span_budget *b = span_budget.lookup(&pid);
    if (!b) {
        struct cuda_span_budget fresh = {};
        fresh.credit_ns = burst - cost;
        fresh.last_ns = now;
        if (span_budget.update(&pid, &fresh) != 0)
            oe_drop(OE_DROP_STATEMAP); /* no budget kept: this process is not limited */
        return 1;
    }
    u64 credit = b->credit_ns + (now > b->last_ns ? now - b->last_ns : 0);
    if (credit > burst)
        credit = burst;
    b->last_ns = now;
    if (credit < cost) {
        b->credit_ns = credit;
        return 0;
    }
    b->credit_ns = credit - cost;
#endif
    return 1;
}

static __always_inline void call_account(struct cuda_call_stats_key *key, u64 dur, u64 bytes, int has_bytes,
                                         int limited)
{
    struct cuda_call_stats *s = call_stats.lookup(key);
    if (!s) {
        u32 zero = 0;
        struct cuda_call_stats *init = call_stats_zero.lookup(&zero);
        if (!init)
            return;
        call_stats.insert(key, init); /* fails when another CPU inserted it meanwhile: fine */
        s = call_stats.lookup(key);
        if (!s) {
            oe_drop(OE_DROP_STATSMAP);
            return;
        }
    }
    __sync_fetch_and_add(&s->calls, 1);
    __sync_fetch_and_add(&s->dur_ns, dur);
    if (limited)
        __sync_fetch_and_add(&s->limited, 1);
    u32 d = dur_bucket(dur);
    if (d > CUDA_DUR_NBOUNDS)
        d = CUDA_DUR_NBOUNDS;
    __sync_fetch_and_add(&s->dur_hist[d], 1);
    if (has_bytes) {
        __sync_fetch_and_add(&s->bytes, bytes);
        u32 k = bytes_bucket(bytes);
        if (k > CUDA_BYTES_NBOUNDS)
            k = CUDA_BYTES_NBOUNDS;
        __sync_fetch_and_add(&s->bytes_hist[k], 1);
    }
}

/* Accounts the returning call; 1 when it also gets a record. */
static __always_inline int call_return(struct pt_regs *ctx, u32 api, struct cuda_call_state *st, u64 now,
                                       u32 kind, u64 bytes, int has_bytes)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 dur = now > st->start_ns ? now - st->start_ns : 0;
    int keep = span_allowed(id >> 32, now, dur);
    struct cuda_call_stats_key key = {};
    key.pid = id >> 32;
    key.device = cuda_device((u32)id);
    key.rc = (s32)PT_REGS_RC(ctx);
    key.api = (u8)api;
    key.kind = (u8)kind;
    key.captured = cuda_captured((u32)id);
    call_account(&key, dur, bytes, has_bytes, !keep);
    return keep;
}

/* A copy's cudaMemcpyKind: the runtime's own argument (dst, src, count, kind[, stream]); the driver's typed entry
 * points (dst, src, ByteCount[, hStream]) name it in the symbol; cuMemcpy / cuMemcpyAsync leave it to unified
 * addressing, which is cudaMemcpyDefault (4) (CUDA 12.9 cuda.h and driver_types.h). */
static __always_inline u32 memcpy_kind(u32 api, struct cuda_call_state *st)
{
    switch (api) {
    case CUDA_API_cuMemcpyHtoD_v2:
    case CUDA_API_cuMemcpyHtoDAsync_v2:
        return 1;
    case CUDA_API_cuMemcpyDtoH_v2:
    case CUDA_API_cuMemcpyDtoHAsync_v2:
        return 2;
    case CUDA_API_cuMemcpyDtoD_v2:
    case CUDA_API_cuMemcpyDtoDAsync_v2:
        return 3;
    case CUDA_API_cuMemcpy:
    case CUDA_API_cuMemcpyAsync:
        return 4;
    default:
        return (u32)st->arg[3];
    }
}

static __always_inline u64 memcpy_stream(u32 api, struct cuda_call_state *st)
{
    if (api == CUDA_API_cudaMemcpyAsync || api == CUDA_API_cudaMemcpyAsync_ptsz)
        return st->arg[4];
    if (api == CUDA_API_cuMemcpyAsync || api == CUDA_API_cuMemcpyHtoDAsync_v2 ||
        api == CUDA_API_cuMemcpyDtoHAsync_v2 || api == CUDA_API_cuMemcpyDtoDAsync_v2)
        return st->arg[3];
    return 0;
}

static __always_inline int memcpy_return(struct pt_regs *ctx, u32 api)
{
    struct cuda_call_key key = {};
    key.tid = (u32)bpf_get_current_pid_tgid();
    key.api = api;
    struct cuda_call_state *st = inflight.lookup(&key);
    if (!st)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u32 kind = memcpy_kind(api, st);
    if (!call_return(ctx, api, st, now, kind, st->arg[2], 1)) {
        inflight.delete(&key);
        return 0;
    }
    struct cuda_memcpy_rec *e = events.ringbuf_reserve(sizeof(struct cuda_memcpy_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        inflight.delete(&key);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    cuda_fill(&e->call, CUDA_EV_MEMCPY, api, st, ctx, now);
    e->dst = st->arg[0];
    e->src = st->arg[1];
    e->bytes = st->arg[2];
    e->kind = kind;
    e->stream = memcpy_stream(api, st);
    events.ringbuf_submit(e, oe_wakeup_flags());
    inflight.delete(&key);
    return 0;
}

/* cuMemCreate(handle, size, const CUmemAllocationProp *prop, flags): the memory is on the device prop names
 * (location {type@8, id@12}: cuda.h, CUDA 12.9; CU_MEM_LOCATION_TYPE_DEVICE = 1; PyTorch's expandable segments
 * set it to the segment's device), which need not be the thread's current one. */
static __always_inline void alloc_prop_device(struct cuda_alloc_rec *e, u64 prop)
{
    s32 loc[2] = {};
    if (prop && bpf_probe_read_user(loc, sizeof(loc), (void *)(prop + 8)) == 0 && loc[0] == 1)
        e->call.device = loc[1];
}

static __always_inline int alloc_return(struct pt_regs *ctx, u32 api)
{
    struct cuda_call_key key = {};
    key.tid = (u32)bpf_get_current_pid_tgid();
    key.api = api;
    struct cuda_call_state *st = inflight.lookup(&key);
    if (!st)
        return 0;
    struct cuda_alloc_rec *e = events.ringbuf_reserve(sizeof(struct cuda_alloc_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        inflight.delete(&key);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    cuda_fill(&e->call, CUDA_EV_ALLOC, api, st, ctx, bpf_ktime_get_ns());
    /* (T **ptr, size_t size, [stream | flags | prop]): the runtime's and the driver's alike */
    e->size = st->arg[1];
    if (api == CUDA_API_cudaMallocManaged || api == CUDA_API_cuMemAllocManaged)
        e->flags = (u32)st->arg[2];
    else if (api == CUDA_API_cuMemCreate)
        alloc_prop_device(e, st->arg[2]);
    else if (api != CUDA_API_cudaMalloc && api != CUDA_API_cuMemAlloc_v2)
        e->stream = st->arg[2];
    if (e->call.rc == 0 && bpf_probe_read_user(&e->ptr, sizeof(e->ptr), (void *)st->arg[0]) != 0)
        e->ptr = 0;
    events.ringbuf_submit(e, oe_wakeup_flags());
    inflight.delete(&key);
    return 0;
}

static __always_inline int free_return(struct pt_regs *ctx, u32 api)
{
    struct cuda_call_key key = {};
    key.tid = (u32)bpf_get_current_pid_tgid();
    key.api = api;
    struct cuda_call_state *st = inflight.lookup(&key);
    if (!st)
        return 0;
    struct cuda_free_rec *e = events.ringbuf_reserve(sizeof(struct cuda_free_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        inflight.delete(&key);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    cuda_fill(&e->call, CUDA_EV_FREE, api, st, ctx, bpf_ktime_get_ns());
    e->ptr = st->arg[0]; /* the pointer, or cuMemRelease's handle */
    if (api != CUDA_API_cudaFree && api != CUDA_API_cuMemFree_v2 && api != CUDA_API_cuMemRelease)
        e->stream = st->arg[1];
    events.ringbuf_submit(e, oe_wakeup_flags());
    inflight.delete(&key);
    return 0;
}

static __always_inline int sync_return(struct pt_regs *ctx, u32 api)
{
    struct cuda_call_key key = {};
    key.tid = (u32)bpf_get_current_pid_tgid();
    key.api = api;
    struct cuda_call_state *st = inflight.lookup(&key);
    if (!st)
        return 0;
    u64 now = bpf_ktime_get_ns();
    if (!call_return(ctx, api, st, now, 0, 0, 0)) {
        inflight.delete(&key);
        return 0;
    }
    struct cuda_sync_rec *e = events.ringbuf_reserve(sizeof(struct cuda_sync_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        inflight.delete(&key);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    cuda_fill(&e->call, CUDA_EV_SYNC, api, st, ctx, now);
    if (api != CUDA_API_cudaDeviceSynchronize)
        e->handle = st->arg[0];
    events.ringbuf_submit(e, oe_wakeup_flags());
    inflight.delete(&key);
    return 0;
}

static __always_inline int graph_return(struct pt_regs *ctx, u32 api)
{
    struct cuda_call_key key = {};
    key.tid = (u32)bpf_get_current_pid_tgid();
    key.api = api;
    struct cuda_call_state *st = inflight.lookup(&key);
    if (!st)
        return 0;
    u64 now = bpf_ktime_get_ns();
    if (!call_return(ctx, api, st, now, 0, 0, 0)) {
        inflight.delete(&key);
        return 0;
    }
    struct cuda_graph_rec *e = events.ringbuf_reserve(sizeof(struct cuda_graph_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        inflight.delete(&key);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    cuda_fill(&e->call, CUDA_EV_GRAPH, api, st, ctx, now);
    e->exec = st->arg[0];
    e->stream = st->arg[1];
    events.ringbuf_submit(e, oe_wakeup_flags());
    inflight.delete(&key);
    return 0;
}

/* Counted only (cudaMemset*, cudaEventRecord*, cudaStreamWaitEvent, stream/event create and destroy,
 * cudaHostRegister/Unregister): calls, duration and, for memset and host register, bytes go to call_stats;
 * no record and no span budget is spent (none of these blocks the host for long). */
static __always_inline int count_return(struct pt_regs *ctx, u32 api)
{
    struct cuda_call_key key = {};
    u64 id = bpf_get_current_pid_tgid();
    key.tid = (u32)id;
    key.api = api;
    struct cuda_call_state *st = inflight.lookup(&key);
    if (!st)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 dur = now > st->start_ns ? now - st->start_ns : 0;
    int ok = PT_REGS_RC(ctx) == 0;
    u64 bytes = 0;
    int has_bytes = 0;
    if (api == CUDA_API_cudaHostRegister) {  /* (ptr, size, flags) */
        bytes = st->arg[1];
        has_bytes = ok;
    } else if (api >= CUDA_API_cudaMemset && api <= CUDA_API_cudaMemsetAsync_ptsz) {  /* (ptr, value, count, ...) */
        bytes = st->arg[2];
        has_bytes = ok;
    } else if (api == CUDA_API_cuMemMap || api == CUDA_API_cuMemUnmap) {  /* (ptr, size, ...) */
        bytes = st->arg[1];
        has_bytes = ok;
    }
    struct cuda_call_stats_key sk = {};
    sk.pid = id >> 32;
    sk.device = cuda_device((u32)id);
    sk.rc = (s32)PT_REGS_RC(ctx);
    sk.api = (u8)api;
    /* the capture calls themselves run on the host: never counted as captured */
    sk.captured = api >= CUDA_API_cudaStreamBeginCapture && api <= CUDA_API_cudaStreamEndCapture_ptsz
                      ? 0 : cuda_captured((u32)id);
    call_account(&sk, dur, bytes, has_bytes, 0);
    inflight.delete(&key);
    return 0;
}

/* ---- stream capture --------------------------------------------------------------- */

static __always_inline void capture_key(struct cuda_capture_key *k, u64 id, u64 stream, u32 api)
{
    k->pid = id >> 32;
    k->stream = stream;
    /* cudaStreamPerThread (0x2), or NULL under the per-thread-default-stream entry points */
    if (stream == 2 || (stream == 0 && (api == CUDA_API_cudaStreamBeginCapture_ptsz ||
                                        api == CUDA_API_cudaStreamBeginCaptureToGraph_ptsz ||
                                        api == CUDA_API_cudaStreamEndCapture_ptsz)))
        k->tid = (u32)id;
}

static __always_inline void capture_open_add(s64 delta)
{
    int zero = 0;
    s64 *open = capture_open.lookup(&zero);
    if (open)
        __sync_fetch_and_add(open, delta);
}

/* cudaStreamBeginCapture(stream, mode), cudaStreamBeginCaptureToGraph(stream, graph, deps, data, n, mode) (`opens`)
 * and cudaStreamEndCapture(stream, &graph): counted, the call itself before the capture opens (it runs on the
 * host). A successful begin opens the capture on this thread. The capture ends (on the thread that began it) when
 * the end succeeds or reports the capture invalidated (cudaErrorStreamCaptureInvalidated 901, ...Unjoined 904: CUDA
 * Runtime API 13.0, cudaStreamEndCapture and driver_types.h), not when it refused to end it (not capturing, wrong
 * stream or thread). */
static __always_inline int capture_return(struct pt_regs *ctx, u32 api, int opens)
{
    struct cuda_call_key key = {};
    u64 id = bpf_get_current_pid_tgid();
    key.tid = (u32)id;
    key.api = api;
    struct cuda_call_state *st = inflight.lookup(&key);
    if (!st)
        return 0;
    s32 rc = (s32)PT_REGS_RC(ctx);
    struct cuda_capture_key ck = {};
    capture_key(&ck, id, st->arg[0], api);
    count_return(ctx, api); /* frees st */
    if (opens && rc == 0) {
        u32 tid = (u32)id;
        if (capture_streams.update(&ck, &tid) != 0)
            oe_drop(OE_DROP_STATEMAP);
        else if (oe_capture_add(tid, 1))
            capture_open_add(1);
    } else if (!opens && (rc == 0 || rc == 901 || rc == 904)) {
        u32 *began = capture_streams.lookup(&ck);
        if (began) {
            u32 tid = *began;
            capture_streams.delete(&ck);
            if (oe_capture_add(tid, -1))
                capture_open_add(-1);
        }
    }
    return 0;
}

static __always_inline int capture_begin_return(struct pt_regs *ctx, u32 api) { return capture_return(ctx, api, 1); }
static __always_inline int capture_end_return(struct pt_regs *ctx, u32 api) { return capture_return(ctx, api, 0); }

/* Commits the thread -> device binding before filling, so the record carries the new device. */
static __always_inline void thread_set_device(u32 tid, s32 device)
{
    struct cuda_thread *t = thread_device.lookup(&tid);
    if (t) {
        t->device = device;
        t->known = 1;
        return;
    }
    struct cuda_thread fresh = {};
    fresh.device = device;
    fresh.known = 1;
    if (thread_device.update(&tid, &fresh) != 0)
        oe_drop(OE_DROP_STATEMAP);
}

/* cudaGetDevice(int *device), probed only while the receiver learns the devices of threads that chose theirs before
 * it attached (receiver.py DeviceLearning: run --pid, --all-processes, an agent restart; detached after a window).
 * A thread whose device is known already skips at entry; a successful return tells the thread's current device.
 * PyTorch asks on nearly every operator (c10::cuda::current_device / GetDevice), so a busy thread is learned at
 * once. */
static __always_inline int get_device_enter(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct cuda_thread *t = thread_device.lookup(&tid);
    if (t && t->known)
        return 0;
    return cuda_enter(ctx, CUDA_API_cudaGetDevice);
}

static __always_inline int get_device_return(struct pt_regs *ctx, u32 api)
{
    struct cuda_call_key key = {};
    u32 tid = (u32)bpf_get_current_pid_tgid();
    key.tid = tid;
    key.api = api;
    struct cuda_call_state *st = inflight.lookup(&key);
    if (!st)
        return 0;
    s32 device = 0;
    if ((s32)PT_REGS_RC(ctx) == 0 && bpf_probe_read_user(&device, sizeof(device), (void *)st->arg[0]) == 0)
        thread_set_device(tid, device);
    inflight.delete(&key);
    return 0;
}

static __always_inline int set_device_return(struct pt_regs *ctx, u32 api)
{
    struct cuda_call_key key = {};
    u32 tid = (u32)bpf_get_current_pid_tgid();
    key.tid = tid;
    key.api = api;
    struct cuda_call_state *st = inflight.lookup(&key);
    if (!st)
        return 0;
    s32 requested = (s32)st->arg[0];
    if ((s32)PT_REGS_RC(ctx) == 0)
        thread_set_device(tid, requested);
    struct cuda_set_device_rec *e = events.ringbuf_reserve(sizeof(struct cuda_set_device_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        inflight.delete(&key);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    cuda_fill(&e->call, CUDA_EV_SET_DEVICE, api, st, ctx, bpf_ktime_get_ns());
    e->requested = requested;
    events.ringbuf_submit(e, oe_wakeup_flags());
    inflight.delete(&key);
    return 0;
}

/* ---- kernel handles: where a launch's `func` comes from ------------------------------- */

/* __cudaGetKernel(cudaKernel_t *k, const void *hostFun) and cudaGetFuncBySymbol(cudaFunction_t *f, const void
 * *symbolPtr) (runtime: the handle stands for a host function the agent symbolizes), cuModuleGetFunction(CUfunction
 * *f, CUmodule m, const char *name) and cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) (driver: the
 * name is the argument). nvcc 13's <<<>>> stub calls __cudaGetKernel once per kernel (its handle is a static of the
 * stub: objdump of torch 2.11's libtorch_cuda.so), Triton cuModuleGetFunction once per compiled kernel, so these
 * records are few. A successful call gives one record. */
static __always_inline int kernel_return(struct pt_regs *ctx, u32 api)
{
    struct cuda_call_key key = {};
    u64 id = bpf_get_current_pid_tgid();
    key.tid = (u32)id;
    key.api = api;
    struct cuda_call_state *st = inflight.lookup(&key);
    if (!st)
        return 0;
    if (PT_REGS_RC(ctx) != 0) {
        inflight.delete(&key);
        return 0;
    }
    struct cuda_kernel_rec *e = events.ringbuf_reserve(sizeof(struct cuda_kernel_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        inflight.delete(&key);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = CUDA_EV_KERNEL;
    e->api = api;
    e->pid = id >> 32;
    bpf_probe_read_user(&e->handle, sizeof(e->handle), (void *)st->arg[0]);
    if (api == CUDA_API_cuModuleGetFunction || api == CUDA_API_cuLibraryGetKernel)
        bpf_probe_read_user_str(e->name, sizeof(e->name), (void *)st->arg[2]);
    else
        e->host_fun = st->arg[1];
    events.ringbuf_submit(e, oe_wakeup_flags());
    inflight.delete(&key);
    return 0;
}

/* ---- kernel launches (entry only) ------------------------------------------------- */

/* The enclosing call of a launch (CUDA_LAUNCH_CONTEXT): one more hash lookup on the hot path. */
struct cuda_launch_ctx {
    u64 start;
    u64 root;
    u64 op;     /* PyTorch operator entry address (0 for a Python function) */
    u32 kind;
    u32 _pad;
};

static __always_inline void launch_context(u32 tid, struct cuda_launch_ctx *lc)
{
#if CUDA_LAUNCH_CONTEXT
    lc->kind = oe_ctx_get(tid, &lc->start, &lc->root, &lc->op);
    if (lc->kind != OE_CTX_TORCH)
        lc->op = 0;
#endif
}

static __always_inline void launch_count(u32 pid, s32 device, struct cuda_launch_args *a, u64 op, u32 api,
                                         u8 captured)
{
    struct cuda_launch_key key = {};
    key.pid = pid;
    key.device = (s16)device;
    key.op = op;
    key.api = (u8)api;
    key.captured = captured;
    key.grid_size = (u64)a->grid[0] * a->grid[1] * a->grid[2];
    key.block_size = (u64)a->block[0] * a->block[1] * a->block[2];
#if CUDA_LAUNCH_FUNC
    key.func = a->func;
#endif
    u64 *n = launch_stats.lookup(&key);
    if (n) {
        /* per-CPU slot, but a preempted program on this CPU may share it: stay atomic */
        __sync_fetch_and_add(n, 1);
        return;
    }
    u64 one = 1;
    if (launch_stats.insert(&key, &one) == 0)
        return;
    n = launch_stats.lookup(&key); /* inserted meanwhile from another CPU */
    if (n)
        __sync_fetch_and_add(n, 1);
    else
        oe_drop(OE_DROP_STATSMAP);
}

#if CUDA_LAUNCH_SAMPLE_EVERY > 0
/* The process's launch number (1-based); 0 when it cannot be kept. Not atomic across threads
 * of one process: the sample spacing may drift under contention, the counts above do not. */
static __always_inline u64 launch_next_seq(u32 pid)
{
    u64 *seq = launch_seq.lookup(&pid);
    if (seq) {
        *seq += 1;
        return *seq;
    }
    u64 first = 1;
    if (launch_seq.insert(&pid, &first) != 0) {
        oe_drop(OE_DROP_STATSMAP);
        return 0;
    }
    return 1;
}
#endif

/* 1 when the launch is recorded into a graph: its thread has a capture open, or it goes to a stream a capture
 * began on (of any thread: PyTorch's autograd runs a captured backward on its device thread, on the forward's
 * stream). Costs nothing while no capture is open; then a stream read and one lookup. A launch from another
 * thread to a stream that only joined a capture (through an event) is not marked. */
static __always_inline u8 launch_captured(u64 id, struct cuda_launch_args *a, u64 sp, u32 smem_at)
{
    if (!capture_any_open())
        return 0;
    if (oe_capture_depth((u32)id))
        return 1;
    u64 stream = a->stream;
    if (sp)
        bpf_probe_read_user(&stream, sizeof(stream), (void *)(sp + smem_at + 8));
    struct cuda_capture_key ck = {};
    capture_key(&ck, id, stream, CUDA_API_cudaStreamBeginCapture);
    return capture_streams.lookup(&ck) != NULL;
}

/* sp: the caller's stack pointer at entry when shared_mem/stream are stack arguments, 0 when `a` already
 * holds them (cudaLaunchKernelExC, cuLaunchKernelEx); smem_at: shared_mem's offset from sp (stream follows):
 * 8 for cudaLaunchKernel, 16 for cuLaunchKernel (blockDimZ comes first). */
static __always_inline int launch_entry(u32 api, u64 id, s32 device, struct cuda_launch_args *a, u64 sp,
                                        u32 smem_at)
{
    u32 pid = id >> 32;
    struct cuda_launch_ctx lc = {};
    launch_context((u32)id, &lc);
    u8 captured = launch_captured(id, a, sp, smem_at);
    launch_count(pid, device, a, lc.op, api, captured);
#if CUDA_LAUNCH_SAMPLE_EVERY > 0
    u64 seq = launch_next_seq(pid);
    if (seq == 0 || seq % CUDA_LAUNCH_SAMPLE_EVERY != 0)
        return 0;
    struct cuda_launch_rec *e = events.ringbuf_reserve(sizeof(struct cuda_launch_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = CUDA_EV_LAUNCH;
    e->api = api;
    e->device = device;
    e->pid = pid;
    e->tid = (u32)id;
    e->ts = bpf_ktime_get_ns();
    e->func = a->func;
    e->grid[0] = a->grid[0];
    e->grid[1] = a->grid[1];
    e->grid[2] = a->grid[2];
    e->block[0] = a->block[0];
    e->block[1] = a->block[1];
    e->block[2] = a->block[2];
    e->shared_mem = a->shared_mem;
    e->stream = a->stream;
    if (sp) {
        /* 0(%rsp) is the return address; the stack arguments follow, 8 bytes each */
        bpf_probe_read_user(&e->shared_mem, sizeof(e->shared_mem), (void *)(sp + smem_at));
        bpf_probe_read_user(&e->stream, sizeof(e->stream), (void *)(sp + smem_at + 8));
        if (smem_at == 16)
            e->shared_mem = (u32)e->shared_mem; /* cuLaunchKernel's sharedMemBytes is an unsigned int */
    }
    e->seq = seq;
    e->captured = captured;
    e->ctx_kind = (u8)lc.kind;
    e->ctx_start = lc.start;
    e->ctx_root = lc.root;
    events.ringbuf_submit(e, oe_wakeup_flags());
#endif
    return 0;
}

/* cudaLaunchKernel(func, dim3 grid, dim3 block, args, sharedMem, stream). x86-64 SysV: a
 * 12-byte dim3 by value takes two INTEGER registers, (x | y << 32) and z, whose upper 32 bits
 * are undefined padding: rdi=func, rsi/rdx=grid, rcx/r8=block, r9=args, sharedMem and stream
 * on the stack. */
static __always_inline int launch_kernel_enter(struct pt_regs *ctx, u32 api)
{
    u64 id = bpf_get_current_pid_tgid();
    s32 device;
    struct cuda_thread *t = launch_thread(id, &device);
    if (!t)
        return 0;
    t->rt_launch_ip = PT_REGS_IP(ctx); /* its call into the driver is this launch (driver_launch_enter) */
    struct cuda_launch_args a = {};
    u64 grid_xy = PT_REGS_PARM2(ctx), block_xy = PT_REGS_PARM4(ctx);
    a.func = PT_REGS_PARM1(ctx);
    a.grid[0] = (u32)grid_xy;
    a.grid[1] = (u32)(grid_xy >> 32);
    a.grid[2] = (u32)PT_REGS_PARM3(ctx);
    a.block[0] = (u32)block_xy;
    a.block[1] = (u32)(block_xy >> 32);
    a.block[2] = (u32)PT_REGS_PARM5(ctx);
    return launch_entry(api, id, device, &a, PT_REGS_SP(ctx), 8);
}

/* cudaLaunchKernelExC(const cudaLaunchConfig_t *config, func, args) */
static __always_inline int launch_exc_enter(struct pt_regs *ctx, u32 api)
{
    u64 id = bpf_get_current_pid_tgid();
    s32 device;
    struct cuda_thread *t = launch_thread(id, &device);
    if (!t)
        return 0;
    t->rt_launch_ip = PT_REGS_IP(ctx); /* its call into the driver is this launch (driver_launch_enter) */
    struct cuda_launch_config cfg = {};
    struct cuda_launch_args a = {};
    /* an unreadable config still counts the launch, with zero dimensions */
    if (bpf_probe_read_user(&cfg, sizeof(cfg), (void *)PT_REGS_PARM1(ctx)) == 0) {
        a.grid[0] = cfg.grid[0];
        a.grid[1] = cfg.grid[1];
        a.grid[2] = cfg.grid[2];
        a.block[0] = cfg.block[0];
        a.block[1] = cfg.block[1];
        a.block[2] = cfg.block[2];
        a.shared_mem = cfg.shared_mem;
        a.stream = cfg.stream;
    }
    a.func = PT_REGS_PARM2(ctx);
    return launch_entry(api, id, device, &a, 0, 0);
}

/* ---- driver API launches (libcuda.so.1): Triton, cuBLAS/cuBLASLt's static runtime, NCCL ----------------- */

#ifndef CUDA_RT_SPAN
#define CUDA_RT_SPAN (16ULL << 20) /* > any libcudart's code (12.x, 13.x: under 1 MiB) */
#endif

/* 1 when this driver launch is the runtime's own call into the driver: a runtime launch of this thread has
 * not reached the driver yet, and the caller (the return address at entry) is code near that runtime launch
 * function, i.e. inside the same libcudart. The mark is consumed either way. A runtime launch that failed
 * before the driver leaves a mark that the next driver launch consumes; it is counted all the same unless
 * its caller lies within CUDA_RT_SPAN of that libcudart. */
static __always_inline int from_runtime(struct cuda_thread *t, struct pt_regs *ctx)
{
    u64 ip = t->rt_launch_ip;
    if (!ip)
        return 0;
    t->rt_launch_ip = 0;
    u64 ret = 0;
    if (bpf_probe_read_user(&ret, sizeof(ret), (void *)PT_REGS_SP(ctx)) != 0)
        return 0;
    u64 d = ret > ip ? ret - ip : ip - ret;
    return d < CUDA_RT_SPAN;
}

/* cuLaunchKernel(CUfunction f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
 * hStream, kernelParams, extra) (cuda.h, CUDA 12/13): rdi=f, rsi/rdx/rcx=grid, r8/r9=block x/y, then on the
 * stack blockDimZ@8, sharedMemBytes@16, hStream@24. */
static __always_inline int driver_launch_enter(struct pt_regs *ctx, u32 api)
{
    u64 id = bpf_get_current_pid_tgid();
    s32 device;
    struct cuda_thread *t = launch_thread(id, &device);
    if (!t || from_runtime(t, ctx))
        return 0;
    struct cuda_launch_args a = {};
    u64 sp = PT_REGS_SP(ctx);
    u32 bz = 0;
    bpf_probe_read_user(&bz, sizeof(bz), (void *)(sp + 8));
    a.func = PT_REGS_PARM1(ctx);
    a.grid[0] = (u32)PT_REGS_PARM2(ctx);
    a.grid[1] = (u32)PT_REGS_PARM3(ctx);
    a.grid[2] = (u32)PT_REGS_PARM4(ctx);
    a.block[0] = (u32)PT_REGS_PARM5(ctx);
    a.block[1] = (u32)PT_REGS_PARM6(ctx);
    a.block[2] = bz;
    return launch_entry(api, id, device, &a, sp, 16);
}

/* cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, kernelParams, extra): CUlaunchConfig is
 * grid@0 block@12 sharedMemBytes@24 (unsigned int) hStream@32 (cuda.h, CUDA 12/13). */
static __always_inline int driver_launch_ex_enter(struct pt_regs *ctx, u32 api)
{
    u64 id = bpf_get_current_pid_tgid();
    s32 device;
    struct cuda_thread *t = launch_thread(id, &device);
    if (!t || from_runtime(t, ctx))
        return 0;
    struct cuda_launch_config cfg = {};
    struct cuda_launch_args a = {};
    bpf_probe_read_user(&cfg, sizeof(cfg), (void *)PT_REGS_PARM1(ctx));
    a.func = PT_REGS_PARM2(ctx);
    a.grid[0] = cfg.grid[0];
    a.grid[1] = cfg.grid[1];
    a.grid[2] = cfg.grid[2];
    a.block[0] = cfg.block[0];
    a.block[1] = cfg.block[1];
    a.block[2] = cfg.block[2];
    a.shared_mem = (u32)cfg.shared_mem;
    a.stream = cfg.stream;
    return launch_entry(api, id, device, &a, 0, 0);
}

/* cuGraphLaunch(hGraphExec, hStream): paired like cudaGraphLaunch, unless it is cudaGraphLaunch's own call
 * into the driver (a cudaGraphLaunch* of this thread is in flight), which is counted there. */
static __always_inline int driver_graph_enter(struct pt_regs *ctx, u32 api)
{
    struct cuda_call_key key = {};
    key.tid = (u32)bpf_get_current_pid_tgid();
    key.api = CUDA_API_cudaGraphLaunch;
    if (inflight.lookup(&key))
        return 0;
    key.api = CUDA_API_cudaGraphLaunch_ptsz;
    if (inflight.lookup(&key))
        return 0;
    return cuda_enter(ctx, api);
}

/* Driver memory calls: a runtime allocation (cudaMalloc, cudaMallocAsync, cudaMallocManaged) or free reaches the
 * driver's cuMemAlloc_v2 / cuMemFree_v2 and their async and managed kin (libcudart 12 resolves them with
 * cuGetProcAddress_v2: its strings name them), and is counted there: a driver call made while one of the
 * thread's runtime allocation calls (or frees) is in flight is not paired. cuMemCreate / cuMemRelease have no
 * runtime counterpart. */
static __always_inline int runtime_inflight(u32 tid, u32 a, u32 b, u32 c, u32 d)
{
    struct cuda_call_key key = {};
    key.tid = tid;
    key.api = a;
    if (inflight.lookup(&key))
        return 1;
    key.api = b;
    if (inflight.lookup(&key))
        return 1;
    key.api = c;
    if (inflight.lookup(&key))
        return 1;
    key.api = d;
    return inflight.lookup(&key) != NULL;
}

static __always_inline int driver_alloc_enter(struct pt_regs *ctx, u32 api)
{
    if (runtime_inflight((u32)bpf_get_current_pid_tgid(), CUDA_API_cudaMalloc, CUDA_API_cudaMallocAsync,
                         CUDA_API_cudaMallocAsync_ptsz, CUDA_API_cudaMallocManaged))
        return 0;
    return cuda_enter(ctx, api);
}

static __always_inline int driver_free_enter(struct pt_regs *ctx, u32 api)
{
    if (runtime_inflight((u32)bpf_get_current_pid_tgid(), CUDA_API_cudaFree, CUDA_API_cudaFreeAsync,
                         CUDA_API_cudaFreeAsync_ptsz, CUDA_API_cudaFree))
        return 0;
    return cuda_enter(ctx, api);
}

/* Driver copies: JAX/XLA's stream executor and Numba copy with the driver's typed entry points (cuMemcpyHtoD_v2,
 * ...Async_v2; cuda.h #defines the plain names to them), CuPy's and Numba's unified copies with cuMemcpy(Async).
 * libcudart 12 resolves the same entry points for its own cudaMemcpy* (its strings name cuMemcpy, cuMemcpyAsync
 * and the typed ones, fetched with cuGetProcAddress_v2): a driver copy made while one of the thread's runtime
 * copies is in flight is that copy, counted there. */
static __always_inline int driver_memcpy_enter(struct pt_regs *ctx, u32 api)
{
    if (runtime_inflight((u32)bpf_get_current_pid_tgid(), CUDA_API_cudaMemcpy, CUDA_API_cudaMemcpy_ptds,
                         CUDA_API_cudaMemcpyAsync, CUDA_API_cudaMemcpyAsync_ptsz))
        return 0;
    return cuda_enter(ctx, api);
}

/* ---- thread exit: forget per-thread state --------------------------------------- */

/* Not filtered by `traced`: common.bpf.c may already have removed the process (order of
 * the two exit hooks is not defined). Costs one hash delete per paired API, + 1, per thread exit. */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    thread_device.delete(&tid);
    u32 open = oe_capture_depth(tid); /* captures the thread left open: closed with it */
    if (open)
        capture_open_add(-(s64)open);
    oe_ctx_forget(tid);
    struct cuda_call_key key = {};
    key.tid = tid;
#pragma unroll
    for (u32 api = 0; api < CUDA_API_COUNT; api++) {
        if (api <= CUDA_API_cudaLaunchKernelExC_ptsz ||
            (api >= CUDA_API_cuLaunchKernel && api <= CUDA_API_cuLaunchKernelEx_ptsz))
            continue; /* launches are entry-only: never in `inflight` (unrolled: no test is left) */
        key.api = api;
        inflight.delete(&key);
    }
    u32 tgid = id >> 32;
    if (tid == tgid) {
#if CUDA_LAUNCH_SAMPLE_EVERY > 0
        launch_seq.delete(&tgid);
#endif
#if CUDA_SPAN_RATE > 0
        span_budget.delete(&tgid);
#endif
    }
    return 0;
}

/* ---- probe functions: one pair per symbol (names used by receiver.py PROBES) ------ */

#define CUDA_CALL(sym, ret_helper)                                                         \
    int enter_##sym(struct pt_regs *ctx) { return cuda_enter(ctx, CUDA_API_##sym); }       \
    int return_##sym(struct pt_regs *ctx) { return ret_helper(ctx, CUDA_API_##sym); }

CUDA_CALL(cudaMemcpy, memcpy_return)
CUDA_CALL(cudaMemcpy_ptds, memcpy_return)
CUDA_CALL(cudaMemcpyAsync, memcpy_return)
CUDA_CALL(cudaMemcpyAsync_ptsz, memcpy_return)
CUDA_CALL(cudaMalloc, alloc_return)
CUDA_CALL(cudaMallocAsync, alloc_return)
CUDA_CALL(cudaMallocAsync_ptsz, alloc_return)
CUDA_CALL(cudaMallocManaged, alloc_return)
CUDA_CALL(cudaFree, free_return)
CUDA_CALL(cudaFreeAsync, free_return)
CUDA_CALL(cudaFreeAsync_ptsz, free_return)
CUDA_CALL(cudaStreamSynchronize, sync_return)
CUDA_CALL(cudaStreamSynchronize_ptsz, sync_return)
CUDA_CALL(cudaDeviceSynchronize, sync_return)
CUDA_CALL(cudaEventSynchronize, sync_return)
CUDA_CALL(cudaSetDevice, set_device_return)
int enter_cudaGetDevice(struct pt_regs *ctx) { return get_device_enter(ctx); }
int return_cudaGetDevice(struct pt_regs *ctx) { return get_device_return(ctx, CUDA_API_cudaGetDevice); }
CUDA_CALL(cudaGraphLaunch, graph_return)
CUDA_CALL(cudaGraphLaunch_ptsz, graph_return)
CUDA_CALL(cudaMemset, count_return)
CUDA_CALL(cudaMemset_ptds, count_return)
CUDA_CALL(cudaMemsetAsync, count_return)
CUDA_CALL(cudaMemsetAsync_ptsz, count_return)
CUDA_CALL(cudaEventRecord, count_return)
CUDA_CALL(cudaEventRecord_ptsz, count_return)
CUDA_CALL(cudaEventRecordWithFlags, count_return)
CUDA_CALL(cudaEventRecordWithFlags_ptsz, count_return)
CUDA_CALL(cudaStreamWaitEvent, count_return)
CUDA_CALL(cudaStreamWaitEvent_ptsz, count_return)
CUDA_CALL(cudaStreamCreate, count_return)
CUDA_CALL(cudaStreamCreateWithFlags, count_return)
CUDA_CALL(cudaStreamCreateWithPriority, count_return)
CUDA_CALL(cudaStreamDestroy, count_return)
CUDA_CALL(cudaEventCreate, count_return)
CUDA_CALL(cudaEventCreateWithFlags, count_return)
CUDA_CALL(cudaEventDestroy, count_return)
CUDA_CALL(cudaHostRegister, count_return)
CUDA_CALL(cudaHostUnregister, count_return)
CUDA_CALL(__cudaGetKernel, kernel_return)
CUDA_CALL(cudaStreamBeginCapture, capture_begin_return)
CUDA_CALL(cudaStreamBeginCapture_ptsz, capture_begin_return)
CUDA_CALL(cudaStreamBeginCaptureToGraph, capture_begin_return)
CUDA_CALL(cudaStreamBeginCaptureToGraph_ptsz, capture_begin_return)
CUDA_CALL(cudaStreamEndCapture, capture_end_return)
CUDA_CALL(cudaStreamEndCapture_ptsz, capture_end_return)
CUDA_CALL(cudaGetFuncBySymbol, kernel_return)

int enter_cudaLaunchKernel(struct pt_regs *ctx) { return launch_kernel_enter(ctx, CUDA_API_cudaLaunchKernel); }
int enter_cudaLaunchKernel_ptsz(struct pt_regs *ctx) { return launch_kernel_enter(ctx, CUDA_API_cudaLaunchKernel_ptsz); }
int enter_cudaLaunchKernelExC(struct pt_regs *ctx) { return launch_exc_enter(ctx, CUDA_API_cudaLaunchKernelExC); }
int enter_cudaLaunchKernelExC_ptsz(struct pt_regs *ctx) { return launch_exc_enter(ctx, CUDA_API_cudaLaunchKernelExC_ptsz); }

int enter_cuLaunchKernel(struct pt_regs *ctx) { return driver_launch_enter(ctx, CUDA_API_cuLaunchKernel); }
int enter_cuLaunchKernel_ptsz(struct pt_regs *ctx) { return driver_launch_enter(ctx, CUDA_API_cuLaunchKernel_ptsz); }
int enter_cuLaunchKernelEx(struct pt_regs *ctx) { return driver_launch_ex_enter(ctx, CUDA_API_cuLaunchKernelEx); }
int enter_cuLaunchKernelEx_ptsz(struct pt_regs *ctx) { return driver_launch_ex_enter(ctx, CUDA_API_cuLaunchKernelEx_ptsz); }
int enter_cuGraphLaunch(struct pt_regs *ctx) { return driver_graph_enter(ctx, CUDA_API_cuGraphLaunch); }
int return_cuGraphLaunch(struct pt_regs *ctx) { return graph_return(ctx, CUDA_API_cuGraphLaunch); }
int enter_cuGraphLaunch_ptsz(struct pt_regs *ctx) { return driver_graph_enter(ctx, CUDA_API_cuGraphLaunch_ptsz); }
int return_cuGraphLaunch_ptsz(struct pt_regs *ctx) { return graph_return(ctx, CUDA_API_cuGraphLaunch_ptsz); }

#define CUDA_DRIVER_CALL(sym, enter_helper, ret_helper)                                    \
    int enter_##sym(struct pt_regs *ctx) { return enter_helper(ctx, CUDA_API_##sym); }     \
    int return_##sym(struct pt_regs *ctx) { return ret_helper(ctx, CUDA_API_##sym); }

CUDA_DRIVER_CALL(cuMemAlloc_v2, driver_alloc_enter, alloc_return)
CUDA_DRIVER_CALL(cuMemAllocAsync, driver_alloc_enter, alloc_return)
CUDA_DRIVER_CALL(cuMemAllocAsync_ptsz, driver_alloc_enter, alloc_return)
CUDA_DRIVER_CALL(cuMemAllocManaged, driver_alloc_enter, alloc_return)
CUDA_DRIVER_CALL(cuMemFree_v2, driver_free_enter, free_return)
CUDA_DRIVER_CALL(cuMemFreeAsync, driver_free_enter, free_return)
CUDA_DRIVER_CALL(cuMemFreeAsync_ptsz, driver_free_enter, free_return)
CUDA_DRIVER_CALL(cuMemCreate, cuda_enter, alloc_return)
CUDA_DRIVER_CALL(cuMemRelease, cuda_enter, free_return)
CUDA_DRIVER_CALL(cuModuleGetFunction, cuda_enter, kernel_return)
CUDA_DRIVER_CALL(cuLibraryGetKernel, cuda_enter, kernel_return)
CUDA_DRIVER_CALL(cuMemcpy, driver_memcpy_enter, memcpy_return)
CUDA_DRIVER_CALL(cuMemcpyAsync, driver_memcpy_enter, memcpy_return)
CUDA_DRIVER_CALL(cuMemcpyHtoD_v2, driver_memcpy_enter, memcpy_return)
CUDA_DRIVER_CALL(cuMemcpyDtoH_v2, driver_memcpy_enter, memcpy_return)
CUDA_DRIVER_CALL(cuMemcpyDtoD_v2, driver_memcpy_enter, memcpy_return)
CUDA_DRIVER_CALL(cuMemcpyHtoDAsync_v2, driver_memcpy_enter, memcpy_return)
CUDA_DRIVER_CALL(cuMemcpyDtoHAsync_v2, driver_memcpy_enter, memcpy_return)
CUDA_DRIVER_CALL(cuMemcpyDtoDAsync_v2, driver_memcpy_enter, memcpy_return)
CUDA_DRIVER_CALL(cuMemMap, cuda_enter, count_return)
CUDA_DRIVER_CALL(cuMemUnmap, cuda_enter, count_return)
