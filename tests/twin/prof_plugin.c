/*
 * A recording NCCL profiler plugin for tests/twin/test_nccl_profiler.py: every call NCCL (here the twin's stand-in
 * libnccl.so.2) makes into it becomes one JSON line in $TEST_PROF_OUT/prof-<pid>.jsonl, with the calling thread, the
 * host time (CLOCK_REALTIME ns) and the descriptor's fields.  Written against the plugin headers NCCL 2.28.9 gives
 * plugin writers (ext-profiler/example/nccl/, in otel_ebpf/twin/include/nccl/), as a user's plugin would be.
 *
 * Exports ncclProfiler_v5 (or, built with -DPROF_V4, only ncclProfiler_v4).  Handles are records that are never
 * freed, each with a process-unique id (the log names handles and parents by id, 0 for NULL), so a handle NCCL
 * hands back after its stop is still readable and shows up in the log.  TEST_PROF_MASK sets the activation mask
 * at init (decimal; default all events); TEST_PROF_MASK_AFTER="N:MASK[,N:MASK...]" sets it to MASK when the N-th
 * GroupApi event of the process starts (a plugin changing the mask while NCCL runs).  TEST_PROF_NULL: event
 * types (a mask) whose startEvent gives NCCL a NULL handle.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "nccl/err.h"
#include "nccl/profiler.h"

struct rec { int id; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static int next_id = 1, group_apis, *mask_ptr, nswitch, switch_at[8], switch_to[8], null_types;

static uint64_t now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int id_of(const void *h) { return h != NULL ? ((const struct rec *)h)->id : 0; }

static struct rec *new_rec(void)
{
    struct rec *r = calloc(1, sizeof(*r));
    if (r != NULL)
        r->id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
    return r;
}

static const char *str(const char *s) { return s != NULL ? s : "(null)"; }

/* One line: {"call": ..., "tid": ..., "ns": ..., <fields>}. */
static void emit(const char *call, const char *fmt, ...)
{
    char body[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof(body), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&mu);
    if (out == NULL) {
        char path[512];
        const char *dir = getenv("TEST_PROF_OUT");
        snprintf(path, sizeof(path), "%s/prof-%d.jsonl", dir != NULL ? dir : "/tmp", (int)getpid());
        out = fopen(path, "a");
    }
    if (out != NULL) {
        fprintf(out, "{\"call\": \"%s\", \"tid\": %ld, \"ns\": %" PRIu64 "%s%s}\n", call, (long)syscall(SYS_gettid),
                now(), *body ? ", " : "", body);
        fflush(out);
    }
    pthread_mutex_unlock(&mu);
}

static ncclResult_t init_common(void **ctx, uint64_t hash, int *mask, const char *name, int nnodes, int nranks,
                                int rank, int version)
{
    struct rec *c = new_rec();
    const char *m = getenv("TEST_PROF_MASK"), *after = getenv("TEST_PROF_MASK_AFTER");
    *ctx = c;
    *mask = m != NULL ? atoi(m) : 0xfff;
    null_types = getenv("TEST_PROF_NULL") != NULL ? atoi(getenv("TEST_PROF_NULL")) : 0;
    mask_ptr = mask;
    for (int used = 0; after != NULL && nswitch < 8 && sscanf(after, "%d:%d%n", &switch_at[nswitch],
                                                              &switch_to[nswitch], &used) == 2; after += used) {
        nswitch++;
        if (after[used] == ',')
            used++;
    }
    emit("init", "\"ctx\": %d, \"hash\": %" PRIu64 ", \"name\": \"%s\", \"nnodes\": %d, \"nranks\": %d, "
         "\"rank\": %d, \"mask_ptr\": \"%p\", \"mask\": %d, \"version\": %d", id_of(c), hash, str(name), nnodes,
         nranks, rank, (void *)mask, *mask, version);
    return ncclSuccess;
}

__attribute__((unused)) static ncclResult_t v5_init(void **ctx, uint64_t comm_id, int *mask, const char *name,
                                                    int nnodes, int nranks, int rank, ncclDebugLogger_t logfn)
{
    (void)logfn;
    return init_common(ctx, comm_id, mask, name, nnodes, nranks, rank, 5);
}

static ncclResult_t finalize(void *ctx)
{
    emit("finalize", "\"ctx\": %d", id_of(ctx));
    return ncclSuccess;
}

static ncclResult_t stop_event(void *h)
{
    emit("stop", "\"id\": %d", id_of(h));
    return ncclSuccess;
}

static void group_api_started(void)
{
    int n = __atomic_add_fetch(&group_apis, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < nswitch; i++)
        if (switch_at[i] == n && mask_ptr != NULL)
            __atomic_store_n(mask_ptr, switch_to[i], __ATOMIC_RELAXED);
}

__attribute__((unused)) static ncclResult_t v5_start(void *ctx, void **h, ncclProfilerEventDescr_v5_t *d)
{
    struct rec *e = new_rec();
    char f[768] = "";
    *h = (d->type & (uint64_t)null_types) ? NULL : e; /* the event is logged, NCCL gets no handle for it */
    switch (d->type) {
    case ncclProfileGroupApi:
        snprintf(f, sizeof(f), "\"captured\": %d, \"depth\": %d", d->groupApi.graphCaptured & 0xff,
                 d->groupApi.groupDepth);
        group_api_started();
        break;
    case ncclProfileCollApi:
        snprintf(f, sizeof(f), "\"func\": \"%s\", \"count\": %zu, \"datatype\": \"%s\", \"root\": %d, \"stream\": "
                 "\"%p\", \"captured\": %d", str(d->collApi.func), d->collApi.count, str(d->collApi.datatype),
                 d->collApi.root, d->collApi.stream, d->collApi.graphCaptured);
        break;
    case ncclProfileP2pApi:
        snprintf(f, sizeof(f), "\"func\": \"%s\", \"count\": %zu, \"datatype\": \"%s\", \"stream\": \"%p\", "
                 "\"captured\": %d", str(d->p2pApi.func), d->p2pApi.count, str(d->p2pApi.datatype), d->p2pApi.stream,
                 d->p2pApi.graphCaptured);
        break;
    case ncclProfileKernelLaunch:
        snprintf(f, sizeof(f), "\"stream\": \"%p\"", d->kernelLaunch.stream);
        break;
    case ncclProfileColl:
        snprintf(f, sizeof(f), "\"seq\": %" PRIu64 ", \"func\": \"%s\", \"send\": \"%p\", \"recv\": \"%p\", \"count\": "
                 "%zu, \"root\": %d, \"datatype\": \"%s\", \"nch\": %d, \"nwarps\": %d, \"algo\": \"%s\", \"proto\": "
                 "\"%s\", \"group\": %d", d->coll.seqNumber, str(d->coll.func), d->coll.sendBuff, d->coll.recvBuff,
                 d->coll.count, d->coll.root, str(d->coll.datatype), d->coll.nChannels, d->coll.nWarps,
                 str(d->coll.algo), str(d->coll.proto), id_of(d->coll.parentGroup));
        break;
    case ncclProfileP2p:
        snprintf(f, sizeof(f), "\"func\": \"%s\", \"buff\": \"%p\", \"count\": %zu, \"datatype\": \"%s\", \"peer\": "
                 "%d, \"nch\": %d, \"group\": %d", str(d->p2p.func), d->p2p.buff, d->p2p.count, str(d->p2p.datatype),
                 d->p2p.peer, d->p2p.nChannels, id_of(d->p2p.parentGroup));
        break;
    case ncclProfileKernelCh:
        snprintf(f, sizeof(f), "\"channel\": %d, \"ptimer\": %" PRIu64, d->kernelCh.channelId, d->kernelCh.pTimer);
        break;
    default:
        break;
    }
    emit("start", "\"ctx\": %d, \"id\": %d, \"type\": %d, \"parent\": %d, \"rank\": %d%s%s", id_of(ctx), id_of(e),
         (int)d->type, id_of(d->parentObj), d->rank, *f ? ", " : "", f);
    return ncclSuccess;
}

static ncclResult_t v5_record(void *h, ncclProfilerEventState_v5_t state, ncclProfilerEventStateArgs_v5_t *a)
{
    if (state == ncclProfilerKernelChStop)
        emit("record", "\"id\": %d, \"state\": %d, \"ptimer\": %" PRIu64, id_of(h), (int)state, a->kernelCh.pTimer);
    else
        emit("record", "\"id\": %d, \"state\": %d", id_of(h), (int)state);
    return ncclSuccess;
}

#ifndef PROF_V4
__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {
    "twin-test-recorder", v5_init, v5_start, stop_event, v5_record, finalize,
};
#else
static ncclResult_t v4_init(void **ctx, int *mask, const char *name, uint64_t hash, int nnodes, int nranks, int rank,
                            ncclDebugLogger_t logfn)
{
    (void)logfn;
    return init_common(ctx, hash, mask, name, nnodes, nranks, rank, 4);
}

/* v4's descriptor has v5's coll/p2p/kernelCh fields, without parentGroup: the v4 parent of a Coll is its Group. */
static ncclResult_t v4_start(void *ctx, void **h, ncclProfilerEventDescr_v4_t *d)
{
    struct rec *e = new_rec();
    *h = e;
    emit("start", "\"ctx\": %d, \"id\": %d, \"type\": %d, \"parent\": %d, \"rank\": %d", id_of(ctx), id_of(e),
         (int)d->type, id_of(d->parentObj), d->rank);
    return ncclSuccess;
}

static ncclResult_t v4_record(void *h, ncclProfilerEventState_v4_t state, ncclProfilerEventStateArgs_v4_t *a)
{
    return v5_record(h, state, (ncclProfilerEventStateArgs_v5_t *)a);
}

__attribute__((visibility("default"))) ncclProfiler_v4_t ncclProfiler_v4 = {
    "twin-test-recorder-v4", v4_init, v4_start, stop_event, v4_record, finalize,
};
#endif
