/*
 * Stand-in libnccl.so.2 for the twin, part 5: the profiler plugin, loaded and initialised as NCCL 2.28.9 does.
 * Not NVIDIA's code.  Follows src/plugin/profiler.cc (ncclProfilerPluginLoad/Unload/Init/Finalize),
 * src/plugin/plugin_open.cc (which library is opened) and src/plugin/profiler/profiler_v5.cc, profiler_v4.cc
 * (which symbol, and the v4 adapter).  The events: nccl_prof_api.c, nccl_prof_plan.c,
 * nccl_prof_order.c, nccl_prof_proxy.c.
 *
 * Which library: NCCL_PROFILER_PLUGIN unset or empty opens "libnccl-profiler.so" (the loader's search path, as
 * NCCL does: no such library, no plugin); "none" (any case) opens nothing; a name is opened as given, then, if it
 * has no '/' and is not "lib*.so", as "libnccl-profiler-<name>.so"; a prefix of "STATIC_PLUGIN" (any case) opens
 * the program itself (dlopen(NULL)).  RTLD_NOW | RTLD_LOCAL.  Then "ncclProfiler_v5", else "ncclProfiler_v4"
 * (adapted: v4's init argument order, descriptors copied to v4's, the API and kernel-launch events and the group API
 * states not passed on, as profiler_v4.cc does).  Loaded once per process at the first comm's init, counted per
 * comm and closed when the last comm is finalized; a failed load is never tried again.
 *
 * init: for each comm, where NCCL calls it (src/init.cc initTransportsRank, before the proxy thread starts): on the
 * thread that sets the comm up (the caller's for a blocking comm, the init thread for a non-blocking one), once
 * its staging area is open, with commHash as NCCL computes it (src/init.cc ncclCommInitRankFunc), &ncclProfiler-
 * EventMask, config.commName, nNodes (the number of distinct OTEL_EBPF_TWIN_NODE values among its ranks, gathered
 * over the comm as NCCL's bootstrap allgather gathers host hashes), nranks, rank and a logger.  An init that fails
 * is logged and NCCL goes on calling the plugin for that comm all the same, as 2.28.9 does.  finalize: with a
 * non-NULL context, from ncclCommDestroy or ncclCommAbort (src/init.cc commFree), after the comm's proxy thread.
 *
 * Known differences from NCCL 2.28.9, not fixed yet:
 * - Plugins exporting only ncclProfiler_v3, _v2 or _v1 are not loaded (NCCL adapts them); the net plugin's
 *   library is not tried as a fallback (the twin has no net plugin).
 * - NCCL_DEBUG_SUBSYS is ignored: the logger prints every subsystem at the NCCL_DEBUG level.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nccl_prof.h"

enum { LOAD_FAILED = -1, LOAD_READY = 0, LOAD_SUCCESS = 1 };

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static int load_status = LOAD_READY, refcount;
static void *lib;
const ncclProfiler_v5_t *twin_profiler;
int twin_prof_mask;

/* ---- NCCL's logger (src/debug.cc): NCCL_DEBUG=VERSION|WARN|INFO|TRACE, "host:pid:tid [dev] NCCL INFO msg" ---- */

static int debug_level(void)
{
    static int level = -1;
    if (level < 0) {
        const char *s = getenv("NCCL_DEBUG");
        level = s == NULL ? NCCL_LOG_NONE : strcasecmp(s, "VERSION") == 0 ? NCCL_LOG_VERSION
              : strcasecmp(s, "WARN") == 0 ? NCCL_LOG_WARN : strcasecmp(s, "INFO") == 0 ? NCCL_LOG_INFO
              : strcasecmp(s, "TRACE") == 0 ? NCCL_LOG_TRACE : NCCL_LOG_NONE;
    }
    return level;
}

void twin_debug_log(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt, ...)
{
    char host[64] = "", msg[1024];
    int dev = -1;
    va_list ap;
    (void)flags; (void)file; (void)line;
    if ((int)level > debug_level())
        return;
    gethostname(host, sizeof(host) - 1);
    (void)cudaGetDevice(&dev);
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s:%d:%d [%d] NCCL %s %s\n", host, (int)getpid(), (int)syscall(SYS_gettid), dev,
            level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_TRACE ? "TRACE" : "INFO", msg);
}

/* ---- commHash (src/include/bitops.h eatHash, digestHash, getHash) ---- */

static void eat_hash(uint64_t acc[2], const void *bytes, size_t size)
{
    const char *ptr = bytes;
    acc[0] ^= size;
    while (size != 0) {
        uint64_t x = 0;
        size_t chunk = size < sizeof(uint64_t) ? size : sizeof(uint64_t);
        acc[0] += acc[1];
        acc[1] ^= acc[0];
        acc[0] ^= acc[0] >> 31;
        acc[0] *= 0x9de62bbc8cef3ce3ULL;
        acc[1] ^= acc[1] >> 32;
        acc[1] *= 0x485cd6311b599e79ULL;
        memcpy(&x, ptr, chunk);
        ptr += chunk;
        size -= chunk;
        acc[0] += x;
    }
}

static uint64_t digest_hash(const uint64_t acc[2])
{
    uint64_t h = acc[0];
    h ^= h >> 31;
    h *= 0xbac3bd562846de6bULL;
    h += acc[1];
    h ^= h >> 32;
    h *= 0x995a187a14e7b445ULL;
    return h;
}

uint64_t twin_nccl_hash(const void *bytes, size_t n)
{
    uint64_t acc[2] = { 1, 1 };
    eat_hash(acc, bytes, n);
    return digest_hash(acc);
}

/* "child hash obtained from (parent hash, split count, color)"; a shrink's split count is 0 and its color 0. */
uint64_t twin_nccl_child_hash(uint64_t parent, int split_count, int color)
{
    uint64_t acc[2] = { 1, 1 };
    eat_hash(acc, &parent, sizeof(parent));
    eat_hash(acc, &split_count, sizeof(split_count));
    eat_hash(acc, &color, sizeof(color));
    return digest_hash(acc);
}

/* ---- the v4 adapter (src/plugin/profiler/profiler_v4.cc) ---- */

static const ncclProfiler_v4_t *v4;
static ncclProfiler_v5_t v4_table;

static ncclResult_t v4_start(void *ctx, void **handle, ncclProfilerEventDescr_v5_t *d)
{
    ncclProfilerEventDescr_v4_t d4;
    memset(&d4, 0, sizeof(d4));
    d4.type = (uint8_t)d->type;
    d4.parentObj = d->parentObj;
    d4.rank = d->rank;
    switch (d->type) {
    case ncclProfileGroup: break;
    case ncclProfileColl:
        d4.coll.seqNumber = d->coll.seqNumber; d4.coll.func = d->coll.func; d4.coll.sendBuff = d->coll.sendBuff;
        d4.coll.recvBuff = d->coll.recvBuff; d4.coll.count = d->coll.count; d4.coll.root = d->coll.root;
        d4.coll.datatype = d->coll.datatype; d4.coll.nChannels = d->coll.nChannels; d4.coll.nWarps = d->coll.nWarps;
        d4.coll.algo = d->coll.algo; d4.coll.proto = d->coll.proto;
        d4.parentObj = d->coll.parentGroup; /* v4's parent of a collective is its group */
        break;
    case ncclProfileP2p:
        d4.p2p.func = d->p2p.func; d4.p2p.buff = d->p2p.buff; d4.p2p.count = d->p2p.count;
        d4.p2p.datatype = d->p2p.datatype; d4.p2p.peer = d->p2p.peer;
        d4.parentObj = d->p2p.parentGroup;
        break;
    case ncclProfileKernelCh:
        d4.kernelCh.channelId = d->kernelCh.channelId; d4.kernelCh.pTimer = d->kernelCh.pTimer;
        break;
    default: return ncclSuccess; /* GroupApi, CollApi, P2pApi, KernelLaunch: v4 knows none; *handle untouched */
    }
    return v4->startEvent(ctx, handle, &d4);
}

static ncclResult_t v4_record(void *handle, ncclProfilerEventState_v5_t state, ncclProfilerEventStateArgs_v5_t *a)
{
    ncclProfilerEventStateArgs_v4_t a4;
    memset(&a4, 0, sizeof(a4));
    if (state != ncclProfilerKernelChStop)
        return ncclSuccess; /* of the states the twin records, v4 takes only this one (the group API's: not) */
    a4.kernelCh.pTimer = a->kernelCh.pTimer;
    return v4->recordEventState(handle, state, &a4);
}

/* v4's init takes (ctx, mask, name, commHash, ...); the table's other functions are set by the first init. */
static ncclResult_t v4_init(void **ctx, uint64_t comm_id, int *mask, const char *name, int nnodes, int nranks,
                            int rank, ncclDebugLogger_t logfn)
{
    ncclResult_t rc = v4->init(ctx, mask, name, comm_id, nnodes, nranks, rank, logfn);
    if (rc != ncclSuccess)
        return rc;
    v4_table.startEvent = v4_start;
    v4_table.recordEventState = v4_record;
    v4_table.stopEvent = v4->stopEvent;
    v4_table.finalize = v4->finalize;
    return ncclSuccess;
}

/* getNcclProfiler_v5, then _v4 (src/plugin/profiler.cc ncclProfilerPluginLoad). */
static const ncclProfiler_v5_t *find_table(void *h)
{
    const ncclProfiler_v5_t *v5 = dlsym(h, "ncclProfiler_v5");
    if (v5 != NULL) {
        TWIN_INFO("PROFILER/Plugin: Loaded %s (v5)", v5->name);
        return v5;
    }
    if ((v4 = dlsym(h, "ncclProfiler_v4")) != NULL) {
        v4_table = (ncclProfiler_v5_t){ .name = v4->name, .init = v4_init };
        TWIN_INFO("PROFILER/Plugin: Loaded %s (v4)", v4->name);
        return &v4_table;
    }
    if (dlsym(h, "ncclProfiler_v3") || dlsym(h, "ncclProfiler_v2") || dlsym(h, "ncclProfiler_v1"))
        TWIN_INFO("PROFILER/Plugin: otel-ebpf twin: v3, v2 and v1 plugins are not adapted (NCCL 2.28.9 does)");
    return NULL;
}

/* ---- which library (src/plugin/plugin_open.cc) ---- */

static void *try_open(const char *name)
{
    void *h;
    if (name == NULL || *name == '\0')
        return NULL;
    if (strncasecmp(name, "STATIC_PLUGIN", strlen(name)) == 0)
        name = NULL; /* the program itself */
    if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) == NULL)
        TWIN_INFO("PROFILER/Plugin: %s: %s", name != NULL ? name : "(program)", dlerror());
    return h;
}

static void *open_lib(const char *want)
{
    char name[255];
    size_t n = want != NULL ? strlen(want) : 0;
    void *h;
    snprintf(name, sizeof(name), "%s", n > 0 ? want : "libnccl-profiler.so");
    if ((h = try_open(name)) != NULL)
        return h;
    /* a bare name, not a path and not a library's file name: libnccl-profiler-<name>.so */
    if (n > 0 && strchr(want, '/') == NULL
        && (strncmp(want, "lib", 3) != 0 || n < 3 || strcmp(want + n - 3, ".so") != 0)) {
        snprintf(name, sizeof(name), "libnccl-profiler-%s.so", want);
        if ((h = try_open(name)) != NULL)
            return h;
    }
    return NULL;
}

/* ncclProfilerPluginLoad: a failed load is final; a loaded plugin is counted once more per comm. */
static void load(void)
{
    const char *name;
    if (__atomic_load_n(&load_status, __ATOMIC_ACQUIRE) == LOAD_FAILED)
        return;
    pthread_mutex_lock(&load_mu);
    if (load_status == LOAD_SUCCESS) {
        ++refcount;
        goto out;
    }
    name = getenv("NCCL_PROFILER_PLUGIN");
    if (name != NULL && strcasecmp(name, "none") == 0)
        goto fail;
    if ((lib = open_lib(name)) == NULL)
        goto fail;
    if ((twin_profiler = find_table(lib)) == NULL) {
        if (name != NULL)
            TWIN_INFO("External profiler plugin %s is unsupported", name);
        goto fail;
    }
    if (name != NULL)
        TWIN_INFO("Successfully loaded external profiler plugin %s", name);
    ++refcount;
    __atomic_store_n(&load_status, LOAD_SUCCESS, __ATOMIC_RELEASE);
    goto out;
fail:
    if (lib != NULL)
        dlclose(lib);
    lib = NULL;
    __atomic_store_n(&load_status, LOAD_FAILED, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&load_mu);
}

/* ncclProfilerPluginUnload: every finalize counts down, loaded or not (a failed load's count goes negative). */
static void unload(void)
{
    pthread_mutex_lock(&load_mu);
    if (--refcount == 0) {
        if (twin_profiler != NULL)
            TWIN_INFO("PROFILER/Plugin: Closing profiler plugin %s", twin_profiler->name);
        twin_profiler = NULL;
        if (lib != NULL)
            dlclose(lib);
        lib = NULL;
        __atomic_store_n(&load_status, LOAD_READY, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&load_mu);
}

/* nNodes: the distinct nodes of the comm's ranks (NCCL: distinct host hashes after the bootstrap allgather). */
static int count_nodes(struct ncclComm *c)
{
    uint32_t *all = calloc((size_t)c->nranks, sizeof(*all));
    int n = 0;
    if (all == NULL || c->nranks == 1 || twin_allgather_bytes(c, &c->node, all, sizeof(*all)) != ncclSuccess) {
        free(all);
        return 1;
    }
    for (int r = 0; r < c->nranks; r++) {
        int seen = 0;
        for (int q = 0; q < r; q++)
            seen |= all[q] == all[r];
        n += !seen;
    }
    free(all);
    return n;
}

void twin_prof_init(struct ncclComm *c)
{
    ncclResult_t rc;
    load();
    c->prof.nnodes = 1;
    __atomic_store_n(&c->prof.state, 1, __ATOMIC_RELEASE); /* finalize from now on, to count the load down */
    if (twin_profiler == NULL)
        return;
    c->prof.nnodes = count_nodes(c);
    rc = twin_profiler->init(&c->prof.ctx, c->prof.hash, &twin_prof_mask, c->prof.name, c->prof.nnodes, c->nranks,
                             c->rank, twin_debug_log);
    if (rc != ncclSuccess)
        TWIN_INFO("Profiler init failed with error '%d'. Continue without profiler.", (int)rc);
}

void twin_prof_finalize(struct ncclComm *c)
{
    int called = 1;
    if (!__atomic_compare_exchange_n(&c->prof.state, &called, 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return;
    twin_prof_proxy_stop(c);
    if (twin_profiler != NULL && c->prof.ctx != NULL)
        twin_profiler->finalize(c->prof.ctx);
    unload();
}
