/* A user's own NCCL profiler plugin (v5 only, named "counting"), for the chaining tests: it logs every call it
 * receives to $COUNTING_LOG, naming its events and contexts by serial numbers, and checks that every handle,
 * parent and context it is given is one of its own. Like NVIDIA's example plugin (NCCL 2.28.9
 * ext-profiler/example/plugin.cc) it keeps stopped events readable, since NCCL names stopped events as parents.
 *
 *   COUNTING_MASK   the activation mask it asks for at init (default Coll|KernelCh|CollApi|ProxyCtrl)
 *   COUNTING_FAIL   "start": every startEvent returns ncclInternalError (after setting its handle);
 *                   "init": init fails
 * Log lines: "init ctx=C commId=H rank=R nranks=N name=S", "start ctx=C type=T ev=E parent=P group=G [...]",
 * "record ev=E state=S [ptimer=T]", "stop ev=E", "finalize ctx=C"; a handle that is not its own is "?". */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl/profiler.h"

#define MAGIC 0x636f756e74696e67ull

struct obj {
    uint64_t magic;
    int serial;
    int stopped;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *g_log;
static int g_events, g_ctxs;
static int g_fail_start;

static int serial(const void *p)
{
    const struct obj *o = p;
    if (!o)
        return 0;
    return o->magic == MAGIC ? o->serial : -1; /* -1: not one of ours */
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    va_list ap;
    if (!g_log)
        return;
    va_start(ap, fmt);
    vfprintf(g_log, fmt, ap);
    va_end(ap);
    fputc('\n', g_log);
    fflush(g_log);
}

static struct obj *new_obj(int *counter)
{
    struct obj *o = calloc(1, sizeof *o);
    o->magic = MAGIC;
    o->serial = ++*counter;
    return o;
}

static ncclResult_t init(void **context, uint64_t commId, int *mask, const char *commName, int nNodes, int nranks,
                         int rank, ncclDebugLogger_t logfn)
{
    (void)nNodes;
    const char *fail = getenv("COUNTING_FAIL"), *m = getenv("COUNTING_MASK");
    pthread_mutex_lock(&g_lock);
    if (!g_log && getenv("COUNTING_LOG"))
        g_log = fopen(getenv("COUNTING_LOG"), "a");
    g_fail_start = fail && strcmp(fail, "start") == 0;
    if (fail && strcmp(fail, "init") == 0) {
        logf_("init failed");
        pthread_mutex_unlock(&g_lock);
        return ncclInternalError;
    }
    struct obj *c = new_obj(&g_ctxs);
    *mask = m ? (int)strtol(m, NULL, 0)
              : ncclProfileColl | ncclProfileKernelCh | ncclProfileCollApi | ncclProfileProxyCtrl;
    logf_("init ctx=%d commId=%#llx rank=%d nranks=%d name=%s logger=%d", c->serial, (unsigned long long)commId, rank,
          nranks, commName ? commName : "", logfn != NULL);
    pthread_mutex_unlock(&g_lock);
    *context = c;
    return ncclSuccess;
}

static ncclResult_t start(void *context, void **eHandle, ncclProfilerEventDescr_v5_t *d)
{
    char extra[160] = "";
    pthread_mutex_lock(&g_lock);
    struct obj *e = new_obj(&g_events);
    if (d->type == ncclProfileColl)
        snprintf(extra, sizeof extra, " group=%d seq=%llu func=%s count=%zu algo=%s", serial(d->coll.parentGroup),
                 (unsigned long long)d->coll.seqNumber, d->coll.func, d->coll.count, d->coll.algo);
    else if (d->type == ncclProfileP2p)
        snprintf(extra, sizeof extra, " group=%d func=%s peer=%d", serial(d->p2p.parentGroup), d->p2p.func,
                 d->p2p.peer);
    else if (d->type == ncclProfileKernelCh)
        snprintf(extra, sizeof extra, " channel=%d ptimer=%llu", d->kernelCh.channelId,
                 (unsigned long long)d->kernelCh.pTimer);
    else if (d->type == ncclProfileGroupApi)
        snprintf(extra, sizeof extra, " depth=%d", d->groupApi.groupDepth);
    logf_("start ctx=%d type=%llu ev=%d parent=%d%s", serial(context), (unsigned long long)d->type, e->serial,
          serial(d->parentObj), extra);
    pthread_mutex_unlock(&g_lock);
    *eHandle = e;
    return g_fail_start ? ncclInternalError : ncclSuccess;
}

static ncclResult_t stop(void *h)
{
    struct obj *e = h;
    pthread_mutex_lock(&g_lock);
    logf_("stop ev=%d%s", serial(h), e && e->magic == MAGIC && e->stopped ? " again" : "");
    if (e && e->magic == MAGIC)
        e->stopped = 1;
    pthread_mutex_unlock(&g_lock);
    return ncclSuccess;
}

static ncclResult_t record(void *h, ncclProfilerEventState_v5_t state, ncclProfilerEventStateArgs_v5_t *a)
{
    pthread_mutex_lock(&g_lock);
    if (state == ncclProfilerKernelChStop && a)
        logf_("record ev=%d state=%d ptimer=%llu", serial(h), state, (unsigned long long)a->kernelCh.pTimer);
    else if (state == ncclProfilerProxyCtrlAppendEnd && a)
        logf_("record ev=%d state=%d appended=%d", serial(h), state, a->proxyCtrl.appendedProxyOps);
    else
        logf_("record ev=%d state=%d", serial(h), state);
    pthread_mutex_unlock(&g_lock);
    return ncclSuccess;
}

static ncclResult_t finalize(void *context)
{
    pthread_mutex_lock(&g_lock);
    logf_("finalize ctx=%d", serial(context));
    pthread_mutex_unlock(&g_lock);
    return ncclSuccess;
}

__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {"counting", init, start, stop, record,
                                                                             finalize};
