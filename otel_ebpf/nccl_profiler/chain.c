/*
 * libnccl-profiler-otel_ebpf: forwarding to a chained profiler plugin (see chain.h for the contract).
 *
 * Thread safety: oe_chain_load runs under a mutex before NCCL's first event of the process; afterwards the table
 * and mask pointer are read-only. Ring slots are claimed with a CAS and read with a seqlock, because NCCL starts
 * events from the application threads and its proxy thread (src/proxy.cc, src/transport/profiler.cc).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "chain.h"

#define RING (1u << OE_RING_BITS)
#define CE_BITS (ncclProfileCeColl | ncclProfileCeSync | ncclProfileCeBatch)
#define V5_BITS ((1 << 12) - 1) /* the event bits NCCL 2.28 (v5) knows */

struct slot {
    uint64_t tag; /* the handle that owns the slot, 0 while it is being rewritten */
    void *ch;     /* the chained plugin's handle of that event */
    int live;     /* 1 from start to stop: the slot is not reused */
};

int oe_chain_on;
static ncclDebugLogger_t g_logger;
static pthread_mutex_t g_load_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_loaded;
static void *g_lib;
static const ncclProfiler_v5_t *g_v5; /* exactly one of g_v5, g_v6 is set when chaining */
static const ncclProfiler_v6_t *g_v6;
static int g_nccl_version;
static int g_mask; /* the int* the chained plugin's init gets: one per process, as NCCL has one */
static struct slot *g_ring;
static pid_t g_pid;
static int g_failed_logged;

void oe_set_logger(ncclDebugLogger_t logfn)
{
    if (logfn)
        __atomic_store_n(&g_logger, logfn, __ATOMIC_RELAXED);
}

void oe_log(ncclDebugLogLevel level, const char *fmt, ...)
{
    ncclDebugLogger_t log = __atomic_load_n(&g_logger, __ATOMIC_RELAXED);
    char buf[512];
    va_list ap;
    if (!log)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    log(level, NCCL_INIT, __FILE__, __LINE__, "PROFILER/otel_ebpf: %s", buf);
}

/* A chained call failed: said once per process, and NCCL goes on (it ignores these results itself). */
static void failed(const char *what, ncclResult_t rc)
{
    if (rc != ncclSuccess && !__atomic_exchange_n(&g_failed_logged, 1, __ATOMIC_RELAXED))
        oe_log(NCCL_LOG_WARN, "chained profiler plugin: %s returned %d (said once; forwarding goes on)", what, rc);
}

/* NCCL 2.28.9 src/plugin/plugin_open.cc tryOpenLib: a case-insensitive prefix of "STATIC_PLUGIN" (strncasecmp over
 * strlen(name)) opens the program itself. */
static void *try_open(const char *name, char *err, size_t errlen)
{
    if (!name || !*name)
        return NULL;
    if (strncasecmp(name, "STATIC_PLUGIN", strlen(name)) == 0)
        name = NULL;
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        snprintf(err, errlen, "%s", dlerror());
    return h;
}

/* NCCL 2.28.9 src/plugin/plugin_open.cc openPluginLib for ncclPluginTypeProfiler: the value as given, then, unless
 * it holds a '/' or is already "lib*.so", libnccl-profiler-<value>.so; names cut at MAX_STR_LEN (255). */
static void *open_like_nccl(const char *spec, char *used, size_t usedlen)
{
    char name[255], err[256] = "";
    size_t n = strlen(spec);
    snprintf(name, sizeof name, "%s", spec);
    void *h = try_open(name, err, sizeof err);
    if (!h && strchr(spec, '/') == NULL &&
        (strncmp(spec, "lib", 3) != 0 || n < 3 || strncmp(spec + n - 3, ".so", 3) != 0)) {
        snprintf(name, sizeof name, "libnccl-profiler-%s.so", spec);
        h = try_open(name, err, sizeof err);
    }
    snprintf(used, usedlen, "%s", name);
    if (!h)
        oe_log(NCCL_LOG_WARN, "OTEL_EBPF_NCCL_PROFILER_CHAIN=%s: not loaded (%s); no chained plugin", spec, err);
    return h;
}

static int take_table(void *lib, const char *sym, const void *self5, const void *self6, const char *used)
{
    const ncclProfiler_v5_t *t = dlsym(lib, sym); /* v5 and v6 tables start alike: name, init, ... */
    if (!t)
        return 0;
    if ((const void *)t == self5 || (const void *)t == self6 || (t->name && strcmp(t->name, "otel_ebpf") == 0)) {
        oe_log(NCCL_LOG_WARN, "OTEL_EBPF_NCCL_PROFILER_CHAIN names otel_ebpf itself (%s): not chained", used);
        return -1;
    }
    if (sym[sizeof "ncclProfiler_v" - 1] == '6')
        g_v6 = (const ncclProfiler_v6_t *)t;
    else
        g_v5 = t;
    oe_log(NCCL_LOG_INFO, "chained profiler plugin %s (%s) from %s", t->name ? t->name : "?", sym, used);
    return 1;
}

void oe_chain_load(int nccl_version, const void *self5, const void *self6)
{
    char used[256];
    pthread_mutex_lock(&g_load_lock);
    if (g_loaded)
        goto out;
    g_loaded = 1;
    g_nccl_version = nccl_version;
    const char *spec = getenv("OTEL_EBPF_NCCL_PROFILER_CHAIN");
    /* "none" disables, as NCCL 2.28.9 src/plugin/profiler.cc ncclProfilerPluginLoad does for its variable */
    if (!spec || !*spec || strcasecmp(spec, "none") == 0)
        goto out;
    g_lib = open_like_nccl(spec, used, sizeof used);
    if (!g_lib)
        goto out;
    /* the newest NCCL would take (src/plugin/profiler.cc: v6 then v5), but the caller's own version first */
    const char *order[2] = {"ncclProfiler_v6", "ncclProfiler_v5"};
    if (nccl_version == 5) {
        order[0] = "ncclProfiler_v5";
        order[1] = "ncclProfiler_v6";
    }
    int got = take_table(g_lib, order[0], self5, self6, used);
    if (got == 0)
        got = take_table(g_lib, order[1], self5, self6, used);
    if (got == 0)
        oe_log(NCCL_LOG_WARN, "%s has no ncclProfiler_v6 or ncclProfiler_v5 (older APIs are not chained)", used);
    if (got == 1)
        g_ring = calloc(RING, sizeof *g_ring);
    if (got != 1 || !g_ring) {
        g_v5 = NULL;
        g_v6 = NULL;
        dlclose(g_lib);
        g_lib = NULL;
        goto out;
    }
    g_pid = getpid();
    __atomic_store_n(&oe_chain_on, 1, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&g_load_lock);
}

__attribute__((destructor)) static void chain_unload(void)
{
    if (g_lib)
        dlclose(g_lib);
}

int oe_chain_mask_now(void)
{
    if (!__atomic_load_n(&oe_chain_on, __ATOMIC_ACQUIRE))
        return 0;
    int m = __atomic_load_n(&g_mask, __ATOMIC_RELAXED);
    /* NCCL master src/plugin/profiler/profiler_v5.cc clears the CE bits of a v5 plugin; NCCL 2.28 has none */
    if (g_v5 || g_nccl_version == 5)
        m &= ~CE_BITS;
    return g_nccl_version == 5 ? (m & V5_BITS) : m;
}

void oe_chain_init(void **cctx, int *ok, uint64_t commId, const char *commName, int nNodes, int nranks, int rank,
                   ncclDebugLogger_t logfn)
{
    ncclResult_t rc;
    *cctx = NULL;
    *ok = 0;
    if (!__atomic_load_n(&oe_chain_on, __ATOMIC_ACQUIRE))
        return;
    if (g_v6)
        rc = g_v6->init(cctx, commId, &g_mask, commName, nNodes, nranks, rank, logfn);
    else
        rc = g_v5->init(cctx, commId, &g_mask, commName, nNodes, nranks, rank, logfn);
    /* NCCL master src/plugin/profiler.cc ncclProfilerPluginInit: a failed init means no profiler for the comm */
    *ok = rc == ncclSuccess;
    failed("init", rc);
}

void oe_chain_finalize(void *cctx, int ok)
{
    if (!ok)
        return;
    failed("finalize", g_v6 ? g_v6->finalize(cctx) : g_v5->finalize(cctx));
}

/* For each event type (bit index), the mask bits for which NCCL starts it: NCCL master src/plugin/profiler.cc
 * (groupApiMask, collApiMask, p2pApiMask in ncclProfilerStart*ApiEvent; ncclProfilerStartGroupEvent,
 * ncclProfilerStartTaskEvents, ncclProfilerStartProxyOpEvent, ...Step..., ...Ctrl..., ...KernelCh...,
 * ncclProfilerCallback, ncclProfilerStartCe*Event); 2.28.9's are the same without the CE bits. */
#define PROXY_DOWN (ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileKernelCh | ncclProfileNetPlugin)
static const int closure[15] = {
    [0] = ncclProfileGroup | ncclProfileColl | ncclProfileP2p | PROXY_DOWN,
    [1] = ncclProfileColl | PROXY_DOWN,
    [2] = ncclProfileP2p | PROXY_DOWN,
    [3] = ncclProfileProxyOp | ncclProfileProxyStep | ncclProfileNetPlugin,
    [4] = ncclProfileProxyStep | ncclProfileNetPlugin,
    [5] = ncclProfileProxyCtrl,
    [6] = ncclProfileKernelCh,
    [7] = ncclProfileNetPlugin,
    [8] = ncclProfileGroupApi | ncclProfileP2pApi | ncclProfileCollApi | ncclProfileKernelLaunch | ncclProfileGroup |
          ncclProfileColl | ncclProfileP2p | PROXY_DOWN | CE_BITS,
    [9] = ncclProfileCollApi | ncclProfileColl | PROXY_DOWN | CE_BITS,
    [10] = ncclProfileP2pApi | ncclProfileP2p | PROXY_DOWN,
    [11] = ncclProfileKernelLaunch,
    [12] = CE_BITS,
    [13] = ncclProfileCeSync,
    [14] = ncclProfileCeBatch,
};

static struct slot *slot_of(uint64_t h)
{
    return &g_ring[(h >> OE_SEQ_SHIFT) & (RING - 1)];
}

/* Our handle -> the chained plugin's, also for a stopped event (seqlock read; see chain.h). */
static void *translate(void *parent)
{
    uint64_t h = (uint64_t)(uintptr_t)parent;
    if (!h)
        return NULL;
    struct slot *s = slot_of(h);
    uint64_t t1 = __atomic_load_n(&s->tag, __ATOMIC_ACQUIRE);
    void *ch = __atomic_load_n(&s->ch, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t t2 = __atomic_load_n(&s->tag, __ATOMIC_RELAXED);
    return (t1 == h && t2 == h) ? ch : NULL;
}

void *oe_chain_start(void *cctx, int ok, const ncclProfilerEventDescr_v5_t *d, size_t dsize)
{
    union {
        ncclProfilerEventDescr_v5_t v5;
        ncclProfilerEventDescr_v6_t v6;
    } c;
    void *ch = NULL;
    uint64_t type = d->type;
    if (!ok || type == 0 || type > ncclProfileCeBatch || (type & (type - 1)))
        return NULL;
    if (!(oe_chain_mask_now() & closure[__builtin_ctzll(type)]))
        return NULL;
    memset(&c, 0, sizeof c);
    memcpy(&c, d, dsize < sizeof c ? dsize : sizeof c);
    /* A ProxyOp of another process (PXN) names that process's handle: NCCL 2.28.9 passes it untouched with
     * proxyOp.pid, and so do we (plugins must not follow it; the example plugin checks the pid). */
    if (!(type == ncclProfileProxyOp && d->proxyOp.pid != g_pid))
        c.v6.parentObj = translate(d->parentObj);
    if (type == ncclProfileColl)
        c.v6.coll.parentGroup = translate(d->coll.parentGroup);
    else if (type == ncclProfileP2p)
        c.v6.p2p.parentGroup = translate(d->p2p.parentGroup);
    failed("startEvent", g_v6 ? g_v6->startEvent(cctx, &ch, &c.v6) : g_v5->startEvent(cctx, &ch, &c.v5));
    return ch;
}

uint64_t oe_chain_alloc(int recorded, unsigned idx, void *ch)
{
    for (int tries = 0; tries < 8; tries++) {
        uint64_t h = OE_HANDLE(__atomic_fetch_add(&oe_seq, 1, __ATOMIC_RELAXED), recorded, idx);
        struct slot *s = slot_of(h);
        int idle = 0;
        if (!__atomic_compare_exchange_n(&s->live, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            continue;
        __atomic_store_n(&s->tag, 0, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        __atomic_store_n(&s->ch, ch, __ATOMIC_RELAXED);
        __atomic_store_n(&s->tag, h, __ATOMIC_RELEASE);
        return h;
    }
    failed("(ring full: live events) stopEvent", g_v6 ? g_v6->stopEvent(ch) : g_v5->stopEvent(ch));
    return 0;
}

/* The live slot of h, or NULL (h was not forwarded: no slot of its own). */
static struct slot *live_slot(uint64_t h)
{
    struct slot *s = slot_of(h);
    if (__atomic_load_n(&s->tag, __ATOMIC_ACQUIRE) != h || !__atomic_load_n(&s->live, __ATOMIC_RELAXED))
        return NULL;
    return s;
}

void oe_chain_stop(uint64_t h)
{
    struct slot *s = live_slot(h);
    if (!s)
        return;
    void *ch = __atomic_load_n(&s->ch, __ATOMIC_RELAXED);
    failed("stopEvent", g_v6 ? g_v6->stopEvent(ch) : g_v5->stopEvent(ch));
    __atomic_store_n(&s->live, 0, __ATOMIC_RELEASE); /* tag and ch stay: children may still name it */
}

void oe_chain_record(uint64_t h, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v5_t *args)
{
    struct slot *s = live_slot(h);
    if (!s)
        return;
    /* NCCL master src/plugin/profiler/profiler_v5.cc drops the CE states for a v5 plugin */
    if (g_v5 && state >= ncclProfilerCeCollStart && state <= ncclProfilerCeBatchComplete)
        return;
    void *ch = __atomic_load_n(&s->ch, __ATOMIC_RELAXED);
    failed("recordEventState",
           g_v6 ? g_v6->recordEventState(ch, state, args) : g_v5->recordEventState(ch, state, args));
}
