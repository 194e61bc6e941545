/*
 * libnccl-profiler-otel_ebpf: an NCCL profiler plugin that turns NCCL's profiler events into the USDT probes of
 * probes.h, for the agent's NCCL receiver. C, no dependency beyond libc; docs/nccl-profiler.md.
 *
 * Exports ncclProfiler_v6 (NCCL 2.29+) and ncclProfiler_v5 (NCCL 2.28; PyTorch 2.11 pins 2.28.9). Not v4: NCCL
 * before 2.28 has no GroupApi event, the hook the activation mask is changed from (below).
 *
 * Activation mask. NCCL 2.28.9 src/plugin/profiler.cc ncclProfilerStartGroupApiEvent loads its one process-wide
 * mask (the int* every init gets) at every collective/p2p append (src/enqueue.cc collTaskAppend, p2pTaskAppend) and
 * calls startEvent(GroupApi) for the outermost group when the mask asks for anything. With no agent attached the
 * mask is ncclProfileGroupApi (plus a chained plugin's), so NCCL makes that one call per group and no other: our
 * GroupApi start reads the semaphores, finds them 0 and returns a NULL handle, which NCCL neither records nor stops
 * (ncclProfilerRecordGroupApiEventState, ncclProfilerStopGroupApiEvent test it). When a semaphore is raised the
 * same call widens the mask to GroupApi|CollApi|P2pApi|Group|Coll|P2p|KernelCh, and narrows it once none is. NCCL
 * loaded the mask for the append in progress before calling us, so the first collective after an attach keeps the
 * old mask: a group of one collective is missed, a longer one is recorded from its second collective on, without a
 * Group parent.
 *
 * Threads: NCCL calls init/finalize and the API events (GroupApi, CollApi, P2pApi: inside the application's NCCL
 * call) from application threads, Group/Coll/P2p from hostStreamPlanTask (an application thread, or CUDA's
 * host-callback thread), KernelCh from its proxy progress thread (src/transport/profiler.cc). Handles and context
 * ids come from atomic counters; the context list has a mutex.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "chain.h"
#include "probes.h"

#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

#define EXPORT __attribute__((visibility("default")))
#define OE_MASK_WIDE                                                                                                 \
    (ncclProfileGroupApi | ncclProfileCollApi | ncclProfileP2pApi | ncclProfileGroup | ncclProfileColl |            \
     ncclProfileP2p | ncclProfileKernelCh)

/* sys/sdt.h _SEMAPHORE form: <provider>_<probe>_semaphore in .probes; the agent's attach increments it. */
#define OE_SEMAPHORE(probe)                                                                                          \
    __extension__ unsigned short otel_ebpf_nccl_##probe##_semaphore                                                  \
        __attribute__((unused, section(".probes"), visibility("hidden")))
OE_SEMAPHORE(comm_init);
OE_SEMAPHORE(comm_finalize);
OE_SEMAPHORE(group_start);
OE_SEMAPHORE(api_start);
OE_SEMAPHORE(coll_start);
OE_SEMAPHORE(p2p_start);
OE_SEMAPHORE(kernel_ch_start);
OE_SEMAPHORE(kernel_ch_stop);
OE_SEMAPHORE(event_stop);
#define SEM(probe) (*(volatile unsigned short *)&otel_ebpf_nccl_##probe##_semaphore)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

struct oe_ctx {
    uint64_t id;
    int *mask;             /* NCCL's ncclProfilerEventMask */
    void *chained;         /* the chained plugin's context */
    int chained_ok;        /* its init succeeded */
    struct oe_ctx *prev, *next;
    struct oe_nccl_comm_rec rec;
};

uint64_t oe_seq = 1;
static uint64_t g_ctx_seq = 1;
static int g_wide;              /* the mask was last set wide */
static unsigned short g_ci_seen; /* comm_init's semaphore when the live communicators were last announced */
static pthread_mutex_t g_mask_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_mask_last = -1;     /* the mask value we last stored */
static int g_mask_foreign;       /* what someone else stored there last (NCCL 2.32's RAS override), kept */
static pthread_mutex_t g_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static struct oe_ctx *g_ctxs;

static void copy_str(char *dst, size_t n, const char *src)
{
    size_t i = 0;
    if (src)
        for (; i + 1 < n && src[i]; i++)
            dst[i] = src[i];
    dst[i] = '\0';
}

static int chain_on(void)
{
    return __atomic_load_n(&oe_chain_on, __ATOMIC_ACQUIRE);
}

/* The semaphores of the probes that need the wide mask (comm_init/comm_finalize do not). */
static inline unsigned recording_sems(void)
{
    return SEM(group_start) | SEM(api_start) | SEM(coll_start) | SEM(p2p_start) | SEM(kernel_ch_start) |
           SEM(kernel_ch_stop) | SEM(event_stop);
}

/* Stores what we need (GroupApi, wide while recording, the chained plugin's) on top of what another writer set:
 * NCCL 2.32 lets RAS set the mask job-wide (ncclProfilerSetRasOverride, re-applied after every init), so a value we
 * did not store is kept as the base. block: wait for the lock (init), else skip when another thread holds it (the
 * next group API event retries). */
static void set_mask(int *mask, int recording, int block)
{
    if (block ? pthread_mutex_lock(&g_mask_lock) : pthread_mutex_trylock(&g_mask_lock))
        return;
    int m = __atomic_load_n(mask, __ATOMIC_RELAXED);
    if (m != g_mask_last)
        g_mask_foreign = m;
    int want = g_mask_foreign | (recording ? OE_MASK_WIDE : ncclProfileGroupApi) | oe_chain_mask_now();
    if (want != m)
        __atomic_store_n(mask, want, __ATOMIC_RELAXED);
    g_mask_last = want;
    __atomic_store_n(&g_wide, recording != 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_mask_lock);
}

/* comm_init again for every live communicator: an agent that attaches after NCCL's init learns them here. */
static void announce_all(void)
{
    pthread_mutex_lock(&g_ctx_lock);
    for (struct oe_ctx *c = g_ctxs; c; c = c->next)
        if (SEM(comm_init))
            STAP_PROBE2(otel_ebpf_nccl, comm_init, c->id, &c->rec);
    pthread_mutex_unlock(&g_ctx_lock);
}

static __attribute__((noinline)) void group_api_slow(struct oe_ctx *ctx, unsigned recording, unsigned short ci)
{
    set_mask(ctx->mask, recording != 0, 0);
    unsigned short seen = __atomic_load_n(&g_ci_seen, __ATOMIC_RELAXED);
    if (ci != seen && __atomic_compare_exchange_n(&g_ci_seen, &seen, ci, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED) &&
        ci > seen)
        announce_all();
}

/* No agent, no chain, the mask narrow: a GroupApi start has nothing to do (one branch, before any prologue). */
static inline int quiet(void)
{
    return !(recording_sems() | SEM(comm_init) | __atomic_load_n(&g_wide, __ATOMIC_RELAXED) | chain_on());
}

/* Whether an event of this type fires its start probe now; only Group, CollApi, P2pApi, Coll, P2p and KernelCh
 * do. */
static inline int recorded(uint64_t type)
{
    switch (type) {
    case ncclProfileGroup: return SEM(group_start) != 0;
    case ncclProfileCollApi:
    case ncclProfileP2pApi: return SEM(api_start) != 0;
    case ncclProfileColl: return SEM(coll_start) != 0;
    case ncclProfileP2p: return SEM(p2p_start) != 0;
    case ncclProfileKernelCh: return SEM(kernel_ch_start) != 0;
    default: return 0;
    }
}

static void fire_start(struct oe_ctx *ctx, uint64_t h, const ncclProfilerEventDescr_v5_t *d)
{
    switch (d->type) {
    case ncclProfileGroup:
        STAP_PROBE2(otel_ebpf_nccl, group_start, h, ctx->id);
        break;
    case ncclProfileCollApi:
    case ncclProfileP2pApi:
        STAP_PROBE2(otel_ebpf_nccl, api_start, h, d->type);
        break;
    case ncclProfileColl: {
        struct oe_nccl_coll_rec r;
        memset(&r, 0, sizeof r);
        r.context = ctx->id;
        r.parent = (uint64_t)(uintptr_t)d->coll.parentGroup;
        r.seq = d->coll.seqNumber;
        r.count = d->coll.count;
        r.send_buff = (uint64_t)(uintptr_t)d->coll.sendBuff;
        r.recv_buff = (uint64_t)(uintptr_t)d->coll.recvBuff;
        r.root = d->coll.root;
        r.nchannels = d->coll.nChannels;
        r.nwarps = d->coll.nWarps;
        copy_str(r.func, sizeof r.func, d->coll.func);
        copy_str(r.datatype, sizeof r.datatype, d->coll.datatype);
        copy_str(r.algo, sizeof r.algo, d->coll.algo);
        copy_str(r.proto, sizeof r.proto, d->coll.proto);
        r.api = (uint64_t)(uintptr_t)d->parentObj;
        STAP_PROBE2(otel_ebpf_nccl, coll_start, h, &r);
        break;
    }
    case ncclProfileP2p: {
        struct oe_nccl_p2p_rec r;
        memset(&r, 0, sizeof r);
        r.context = ctx->id;
        r.parent = (uint64_t)(uintptr_t)d->p2p.parentGroup;
        r.count = d->p2p.count;
        r.buff = (uint64_t)(uintptr_t)d->p2p.buff;
        r.peer = d->p2p.peer;
        r.nchannels = d->p2p.nChannels;
        copy_str(r.func, sizeof r.func, d->p2p.func);
        copy_str(r.datatype, sizeof r.datatype, d->p2p.datatype);
        r.api = (uint64_t)(uintptr_t)d->parentObj;
        STAP_PROBE2(otel_ebpf_nccl, p2p_start, h, &r);
        break;
    }
    case ncclProfileKernelCh: {
        uint32_t channel = d->kernelCh.channelId;
        STAP_PROBE4(otel_ebpf_nccl, kernel_ch_start, h, (uint64_t)(uintptr_t)d->parentObj, channel,
                    d->kernelCh.pTimer);
        break;
    }
    }
}

static __attribute__((noinline)) ncclResult_t start_event(void *context, void **eHandle,
                                                          const ncclProfilerEventDescr_v5_t *d, size_t dsize)
{
    struct oe_ctx *ctx = context;
    uint64_t type = d->type, h = 0;
    *eHandle = NULL;
    if (UNLIKELY(!ctx || type == 0 || type > ncclProfileCeBatch))
        return ncclSuccess;
    if (type == ncclProfileGroupApi)
        group_api_slow(ctx, recording_sems(), SEM(comm_init));
    int rec = recorded(type);
    unsigned idx = (unsigned)__builtin_ctzll(type);
    if (UNLIKELY(chain_on())) {
        void *ch = oe_chain_start(ctx->chained, ctx->chained_ok, d, dsize);
        if (ch)
            h = oe_chain_alloc(rec, idx, ch);
    }
    if (!h && rec)
        h = OE_HANDLE(__atomic_fetch_add(&oe_seq, 1, __ATOMIC_RELAXED), 1, idx);
    if (h && rec)
        fire_start(ctx, h, d);
    *eHandle = (void *)(uintptr_t)h;
    return ncclSuccess;
}

static ncclResult_t start_v5(void *context, void **eHandle, ncclProfilerEventDescr_v5_t *d)
{
    if (d->type == ncclProfileGroupApi && __builtin_expect(quiet(), 1)) {
        *eHandle = NULL;
        return ncclSuccess;
    }
    return start_event(context, eHandle, d, sizeof *d);
}

/* v6 descriptors are v5's with the CE members appended to the union (nccl/profiler.h asserts it). */
static ncclResult_t start_v6(void *context, void **eHandle, ncclProfilerEventDescr_v6_t *d)
{
    if (d->type == ncclProfileGroupApi && __builtin_expect(quiet(), 1)) {
        *eHandle = NULL;
        return ncclSuccess;
    }
    return start_event(context, eHandle, (const ncclProfilerEventDescr_v5_t *)(const void *)d, sizeof *d);
}

/* NULL is tolerated: NCCL 2.28.9 ncclProfilerCallback (net plugin events) stops *eHandle unchecked. */
static ncclResult_t stop_event(void *eHandle)
{
    uint64_t h = (uint64_t)(uintptr_t)eHandle;
    if (!h)
        return ncclSuccess;
    if ((h & OE_REC_BIT) && SEM(event_stop))
        STAP_PROBE2(otel_ebpf_nccl, event_stop, h, (uint64_t)OE_HANDLE_TYPE(h));
    if (UNLIKELY(chain_on()))
        oe_chain_stop(h);
    return ncclSuccess;
}

static ncclResult_t record_state(void *eHandle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v5_t *args)
{
    uint64_t h = (uint64_t)(uintptr_t)eHandle;
    if (!h)
        return ncclSuccess;
    if (state == ncclProfilerKernelChStop && args && (h & OE_REC_BIT) && OE_HANDLE_TYPE(h) == ncclProfileKernelCh &&
        SEM(kernel_ch_stop))
        STAP_PROBE2(otel_ebpf_nccl, kernel_ch_stop, h, args->kernelCh.pTimer);
    if (UNLIKELY(chain_on()))
        oe_chain_record(h, state, args);
    return ncclSuccess;
}

static ncclResult_t init(int version, void **context, uint64_t commId, int *mask, const char *commName, int nNodes,
                         int nranks, int rank, ncclDebugLogger_t logfn);

static ncclResult_t init_v5(void **context, uint64_t commId, int *mask, const char *commName, int nNodes, int nranks,
                            int rank, ncclDebugLogger_t logfn)
{
    return init(5, context, commId, mask, commName, nNodes, nranks, rank, logfn);
}

static ncclResult_t init_v6(void **context, uint64_t commId, int *mask, const char *commName, int nNodes, int nranks,
                            int rank, ncclDebugLogger_t logfn)
{
    return init(6, context, commId, mask, commName, nNodes, nranks, rank, logfn);
}

static ncclResult_t finalize(void *context)
{
    struct oe_ctx *ctx = context;
    if (!ctx)
        return ncclSuccess;
    pthread_mutex_lock(&g_ctx_lock);
    if (ctx->prev)
        ctx->prev->next = ctx->next;
    else
        g_ctxs = ctx->next;
    if (ctx->next)
        ctx->next->prev = ctx->prev;
    pthread_mutex_unlock(&g_ctx_lock);
    if (SEM(comm_finalize))
        STAP_PROBE1(otel_ebpf_nccl, comm_finalize, ctx->id);
    oe_chain_finalize(ctx->chained, ctx->chained_ok);
    free(ctx);
    return ncclSuccess;
}

EXPORT ncclProfiler_v5_t ncclProfiler_v5 = {"otel_ebpf", init_v5, start_v5, stop_event, record_state, finalize};
EXPORT ncclProfiler_v6_t ncclProfiler_v6 = {"otel_ebpf", init_v6, start_v6, stop_event, record_state, finalize};

/* NCCL 2.28.9 src/plugin/profiler.cc ncclProfilerPluginInit: once per communicator (ncclCommInitRank*, split,
 * shrink), from the thread that creates it; NCCL master unloads the plugin when init fails, so only an allocation
 * failure is returned. */
static ncclResult_t init(int version, void **context, uint64_t commId, int *mask, const char *commName, int nNodes,
                         int nranks, int rank, ncclDebugLogger_t logfn)
{
    *context = NULL;
    oe_set_logger(logfn);
    oe_chain_load(version, &ncclProfiler_v5, &ncclProfiler_v6);
    struct oe_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return ncclSystemError;
    ctx->id = __atomic_fetch_add(&g_ctx_seq, 1, __ATOMIC_RELAXED);
    ctx->mask = mask;
    ctx->rec.comm_hash = commId;
    ctx->rec.rank = rank;
    ctx->rec.nranks = nranks;
    ctx->rec.nnodes = nNodes;
    ctx->rec.version = OE_NCCL_PROBES_VERSION;
    copy_str(ctx->rec.name, sizeof ctx->rec.name, commName);
    oe_chain_init(&ctx->chained, &ctx->chained_ok, commId, commName, nNodes, nranks, rank, logfn);
    unsigned recording = recording_sems();
    set_mask(mask, recording != 0, 1);
    pthread_mutex_lock(&g_ctx_lock);
    ctx->next = g_ctxs;
    if (g_ctxs)
        g_ctxs->prev = ctx;
    g_ctxs = ctx;
    pthread_mutex_unlock(&g_ctx_lock);
    if (SEM(comm_init))
        STAP_PROBE2(otel_ebpf_nccl, comm_init, ctx->id, &ctx->rec);
    *context = ctx;
    return ncclSuccess;
}
