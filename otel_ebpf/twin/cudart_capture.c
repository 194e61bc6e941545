/*
 * Stand-in libcudart.so.13 for the twin, part 4: stream capture, as the CUDA 13.0 runtime does it for the calls
 * torch 2.11 makes (aten/src/ATen/cuda/CUDAGraph.cpp capture_begin / capture_end, c10/cuda/CUDAGraphsC10Utils.h,
 * c10/cuda/CUDACachingAllocator.cpp cudaMallocMaybeCapturing, ProcessGroupNCCL's collectives).  Not NVIDIA's
 * library.  Behaviour, from cuda_runtime_api.h 13.0 (cudaStreamBeginCapture, cudaStreamEndCapture,
 * cudaStreamIsCapturing, cudaStreamGetCaptureInfo, cudaThreadExchangeStreamCaptureMode) and the CUDA C++
 * Programming Guide 13.0, "CUDA Graphs" > "Stream Capture" (cross-stream dependencies, prohibited operations,
 * invalidation):
 * - cudaStreamBeginCapture: not on the legacy stream (cudaErrorStreamCaptureUnsupported), not on a stream that
 *   already captures (cudaErrorIllegalState); the stream records into a new graph under a new capture id,
 *   unique in the process, from 1.
 * - Work placed on a capturing stream becomes a node of the graph, not run: kernels, copies, memsets, host
 *   functions, callbacks, cudaFreeAsync, and the stand-in NCCL's groups (cudart_streams.c __cudaTwinLaunch).
 *   Each node depends on its stream's dependency set, which then is that node alone.  cudaEventRecord on a
 *   capturing stream makes no node: the event is "captured" with the stream's set; a stream that waits for
 *   it joins the capture (or, already in it, adds that set): this is how ProcessGroupNCCL's stream and
 *   torch's side streams join a capture.  No implicit legacy-stream wait and no stream wait is placed.
 * - Refused, invalidating the capture (its cudaStreamEndCapture then returns cudaErrorStreamCaptureInvalidated
 *   and no graph): host-synchronous work on a capturing stream, querying or synchronising it or its device
 *   (cudaErrorStreamCaptureUnsupported); the legacy stream while a blocking stream of its device captures
 *   (cudaErrorStreamCaptureImplicit); waiting from a capturing stream for an event recorded outside it
 *   without cudaEventWaitExternal, or merging two captures (cudaErrorStreamCaptureIsolation); and the
 *   "potentially unsafe" calls (cudaMalloc, cudaFree, cudaHostAlloc...) the thread's capture mode forbids
 *   (cudaErrorStreamCaptureUnsupported; torch wraps its cudaMalloc during capture in a relaxed mode guard).
 * - cudaStreamEndCapture: on the stream it began on (else cudaErrorStreamCaptureUnmatched), from the same
 *   thread unless relaxed (cudaErrorStreamCaptureWrongThread); every stream that joined must have been joined
 *   back (each node its set holds an ancestor of the origin's next node, else cudaErrorStreamCaptureUnjoined);
 *   all of them stop capturing.
 * Simplified (torch does not observe it): an event recorded in a capture that has ended is complete for a
 * stream that does not capture; cudaEventRecordExternal and cudaEventWaitExternal make no event nodes;
 * cudaStreamBeginCaptureToGraph and cudaStreamUpdateCaptureDependencies are not exported (torch 2.11 does not
 * import them: no conditional nodes).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_twin.h"

struct twin_capture {
    unsigned long long id;
    enum cudaStreamCaptureMode mode;
    pthread_t thread;           /* the thread that began it (cudaStreamCaptureModeThreadLocal's rule) */
    struct twin_graph *graph;
    struct twin_stream *origin; /* where it began: where it must end */
    int invalid;                /* a rule was broken: it ends with cudaErrorStreamCaptureInvalidated */
    struct twin_capture *next;
};

static struct twin_capture *captures; /* the active ones, under q_mu */
static unsigned long long last_capture_id;
int twin_active_captures;
/* cudaStreamCaptureModeGlobal is every thread's mode until it exchanges it (cuda_runtime_api.h 13.0). */
static __thread enum cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;
static __thread cudaGraphEdgeData *edge_buf; /* cudaStreamGetCaptureInfo's edge data: all default edges */
static __thread size_t edge_cap;

/* ---- the captures' state, under q_mu ---- */
static struct twin_capture *capture_by_id_locked(unsigned long long id)
{
    struct twin_capture *c = captures;
    while (c != NULL && c->id != id)
        c = c->next;
    return c;
}

/* The legacy stream while blocking streams of its device capture: each such capture is invalidated. */
static int implicit_locked(const struct twin_stream *f, int invalidate)
{
    int hit = 0;
    if (!f->legacy)
        return 0;
    for (struct twin_stream *g = all_streams; g != NULL; g = g->next_all)
        if (g->cap != NULL && g->dev == f->dev && !(g->flags & cudaStreamNonBlocking)) {
            hit = 1;
            if (invalidate)
                g->cap->invalid = 1;
        }
    return hit;
}

cudaError_t capture_gate_locked(struct twin_stream *f)
{
    if (twin_active_captures == 0)
        return cudaSuccess;
    if (implicit_locked(f, 1))
        return cudaErrorStreamCaptureImplicit;
    return f->cap != NULL && f->cap->invalid ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
}

cudaError_t capture_node_locked(struct twin_stream *const *fs, int n, const struct twin_gnode *proto)
{
    struct twin_deps deps = { 0 };
    struct twin_gnode *node = NULL;
    cudaError_t rc = cudaSuccess;
    for (int i = 0; i < n && rc == cudaSuccess; i++)
        if (deps_merge(&deps, &fs[i]->deps) != 0)
            rc = cudaErrorMemoryAllocation;
    if (rc == cudaSuccess)
        rc = graph_add_locked(fs[0]->cap->graph, proto, &deps, &node);
    for (int i = 0; i < n && rc == cudaSuccess; i++) {
        fs[i]->deps.n = 0;
        if (deps_add(&fs[i]->deps, node) != 0)
            rc = cudaErrorMemoryAllocation;
    }
    deps_clear(&deps);
    if (rc != cudaSuccess)
        fs[0]->cap->invalid = 1; /* a graph that lost a node is no graph of what was captured */
    return rc;
}

cudaError_t capture_op_locked(struct twin_stream *f, const struct op *o, int host_wait)
{
    struct twin_gnode proto = { .kind = GN_OP, .op = *o };
    if (host_wait) {
        f->cap->invalid = 1;
        return cudaErrorStreamCaptureUnsupported;
    }
    if (o->kind == OP_RECORD) {
        o->u.rec.e->cap_id = f->cap->id;
        if (deps_set(&o->u.rec.e->deps, &f->deps) != 0) {
            f->cap->invalid = 1;
            return cudaErrorMemoryAllocation;
        }
        return cudaSuccess;
    }
    proto.op.next = NULL;
    proto.op.pos = 0;
    return capture_node_locked(&f, 1, &proto);
}

cudaError_t capture_wait_locked(struct twin_stream *f, struct twin_event *ev, unsigned flags)
{
    struct twin_capture *c = ev->cap_id != 0 ? capture_by_id_locked(ev->cap_id) : NULL;
    if (c == NULL && f->cap == NULL)
        return cudaSuccess; /* recorded in a capture that has ended: it stands for no work to wait for */
    if (c == NULL) {
        if (ev->cap_id == 0 && ((flags & cudaEventWaitExternal) || ev->rec_on == NULL))
            return cudaSuccess; /* an external wait (no event node here), or an event never recorded */
        f->cap->invalid = 1;
        return cudaErrorStreamCaptureIsolation;
    }
    if (f->cap == NULL) { /* f joins the capture */
        if (deps_set(&f->deps, &ev->deps) != 0) {
            c->invalid = 1;
            return cudaErrorMemoryAllocation;
        }
        f->cap = c;
        return cudaSuccess;
    }
    if (f->cap != c) {
        f->cap->invalid = c->invalid = 1;
        return cudaErrorStreamCaptureIsolation;
    }
    if (deps_merge(&f->deps, &ev->deps) != 0) {
        c->invalid = 1;
        return cudaErrorMemoryAllocation;
    }
    return cudaSuccess;
}

cudaError_t capture_sync_check_locked(struct twin_stream *f, int dev)
{
    cudaError_t rc;
    int hit = 0;
    if (twin_active_captures == 0)
        return cudaSuccess;
    if (f != NULL) {
        if ((rc = capture_gate_locked(f)) != cudaSuccess)
            return rc;
        if (f->cap == NULL)
            return cudaSuccess;
        f->cap->invalid = 1;
        return cudaErrorStreamCaptureUnsupported;
    }
    for (struct twin_stream *g = all_streams; g != NULL; g = g->next_all)
        if (g->cap != NULL && g->dev == dev) {
            g->cap->invalid = 1;
            hit = 1;
        }
    return hit ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

/* cudaThreadExchangeStreamCaptureMode's rules: a thread in global mode may not make potentially unsafe calls
 * while it has a capture not begun relaxed, or another thread has one begun global; in thread-local mode only
 * its own captures count; in relaxed mode none does.  The captures that forbid the call are invalidated. */
cudaError_t capture_unsafe_call(void)
{
    int hit = 0;
    if (__atomic_load_n(&twin_active_captures, __ATOMIC_ACQUIRE) == 0 || thread_mode == cudaStreamCaptureModeRelaxed)
        return cudaSuccess;
    pthread_mutex_lock(&q_mu);
    for (struct twin_capture *c = captures; c != NULL; c = c->next) {
        int own = pthread_equal(c->thread, pthread_self());
        if (c->mode != cudaStreamCaptureModeRelaxed
            && (own || (thread_mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal))) {
            c->invalid = 1;
            hit = 1;
        }
    }
    pthread_mutex_unlock(&q_mu);
    return hit ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}

cudaError_t capture_launch(cudaStream_t st)
{
    struct twin_gnode proto = { .kind = GN_KERNEL };
    struct twin_stream *f;
    cudaError_t rc = cudaSuccess;
    if (__atomic_load_n(&twin_active_captures, __ATOMIC_ACQUIRE) == 0)
        return cudaSuccess;
    pthread_mutex_lock(&q_mu);
    if ((f = resolve_locked(st)) != NULL && (rc = capture_gate_locked(f)) == cudaSuccess && f->cap != NULL
        && (rc = capture_node_locked(&f, 1, &proto)) == cudaSuccess)
        TWIN_COUNT(TWIN_CAPTURED_LAUNCHES);
    pthread_mutex_unlock(&q_mu);
    return rc == cudaSuccess ? cudaSuccess : fail(rc);
}

/* ---- the capture API ---- */
API cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    struct twin_capture *c = calloc(1, sizeof(*c));
    struct twin_graph *g = graph_new();
    struct twin_stream *f = NULL;
    cudaError_t rc = cudaSuccess;
    T();
    if ((unsigned)mode > cudaStreamCaptureModeRelaxed)
        rc = cudaErrorInvalidValue;
    else if (s == NULL || s == cudaStreamLegacy)
        rc = cudaErrorStreamCaptureUnsupported;
    else if (c == NULL || g == NULL)
        rc = cudaErrorMemoryAllocation;
    pthread_mutex_lock(&q_mu);
    if (rc == cudaSuccess && (f = resolve_locked(s)) == NULL)
        rc = cudaErrorInvalidResourceHandle;
    else if (rc == cudaSuccess && f->cap != NULL)
        rc = cudaErrorIllegalState;
    if (rc == cudaSuccess) {
        *c = (struct twin_capture){ .id = ++last_capture_id, .mode = mode, .thread = pthread_self(), .graph = g,
                                    .origin = f, .next = captures };
        captures = c;
        graph_set_capturing(g, 1);
        f->cap = c;
        f->deps.n = 0;
        __atomic_add_fetch(&twin_active_captures, 1, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&q_mu);
    if (rc == cudaSuccess)
        return cudaSuccess;
    free(c);
    if (g != NULL)
        graph_free(g);
    return fail(rc);
}

/* Ends capture c begun on f, under q_mu: every stream in it stops capturing; the error it ends with. */
static cudaError_t capture_finish_locked(struct twin_capture *c, struct twin_stream *f)
{
    cudaError_t rc = c->invalid ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
    struct twin_capture **pp = &captures;
    for (struct twin_stream *g = all_streams; g != NULL; g = g->next_all)
        if (g->cap == c && g != f && rc == cudaSuccess && !graph_joined_locked(c->graph, &f->deps, &g->deps))
            rc = cudaErrorStreamCaptureUnjoined;
    for (struct twin_stream *g = all_streams; g != NULL; g = g->next_all)
        if (g->cap == c) {
            g->cap = NULL;
            deps_clear(&g->deps);
        }
    while (*pp != c)
        pp = &(*pp)->next;
    *pp = c->next;
    __atomic_sub_fetch(&twin_active_captures, 1, __ATOMIC_ACQ_REL);
    graph_set_capturing(c->graph, 0);
    return rc;
}

API cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *pGraph)
{
    struct twin_capture *c = NULL, *ended = NULL;
    struct twin_stream *f;
    cudaError_t rc = cudaSuccess;
    T();
    pthread_mutex_lock(&q_mu);
    if (pGraph == NULL)
        rc = cudaErrorInvalidValue;
    else if ((f = resolve_locked(s)) == NULL)
        rc = cudaErrorInvalidResourceHandle;
    else if ((c = f->cap) == NULL)
        rc = cudaErrorIllegalState;
    else if (c->origin != f)
        rc = cudaErrorStreamCaptureUnmatched; /* and the capture is invalidated, below */
    else if (c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->thread, pthread_self()))
        rc = cudaErrorStreamCaptureWrongThread;
    else
        rc = capture_finish_locked(ended = c, f);
    if (rc == cudaErrorStreamCaptureUnmatched)
        c->invalid = 1;
    pthread_mutex_unlock(&q_mu);
    if (ended != NULL) {
        *pGraph = rc == cudaSuccess ? (cudaGraph_t)ended->graph : NULL;
        if (rc != cudaSuccess)
            graph_free(ended->graph); /* "If capture was invalidated ... a NULL graph will be returned" */
        free(ended);
    }
    return rc == cudaSuccess ? cudaSuccess : fail(rc);
}

/* cudaStreamCaptureStatusInvalidated until the capture is ended; on the legacy stream while a blocking stream
 * of its device captures: cudaErrorStreamCaptureImplicit, which invalidates nothing (cuda_runtime_api.h). */
static cudaError_t capture_status_locked(cudaStream_t s, enum cudaStreamCaptureStatus *st,
                                         struct twin_capture **active)
{
    struct twin_stream *f = resolve_locked(s);
    *active = NULL;
    if (f == NULL)
        return cudaErrorInvalidResourceHandle;
    if (twin_active_captures != 0 && implicit_locked(f, 0))
        return cudaErrorStreamCaptureImplicit;
    *st = f->cap == NULL ? cudaStreamCaptureStatusNone
        : f->cap->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    if (*st == cudaStreamCaptureStatusActive)
        *active = f->cap;
    return cudaSuccess;
}

API cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st)
{
    struct twin_capture *c;
    cudaError_t rc = cudaErrorInvalidValue;
    pthread_mutex_lock(&q_mu);
    if (st != NULL)
        rc = capture_status_locked(s, st, &c);
    pthread_mutex_unlock(&q_mu);
    return rc == cudaSuccess ? cudaSuccess : fail(rc);
}

/* Private to the twin's libnccl.so.2 (nccl_twin.h): whether s is in an active capture, with no error kept for
 * cudaGetLastError, so the stand-in NCCL can tell its profiler (graphCaptured) without touching torch's view. */
API int __cudaTwinStreamCapturing(cudaStream_t s)
{
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    struct twin_capture *c;
    pthread_mutex_lock(&q_mu);
    if (capture_status_locked(s, &st, &c) != cudaSuccess)
        st = cudaStreamCaptureStatusNone;
    pthread_mutex_unlock(&q_mu);
    return st == cudaStreamCaptureStatusActive;
}

/* The id, graph and dependency set are given only while the capture is active; the set is the stream's own
 * array, valid until the next call that works on the stream, as the real one is. */
API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, enum cudaStreamCaptureStatus *st, unsigned long long *id,
                                         cudaGraph_t *g, const cudaGraphNode_t **deps, const cudaGraphEdgeData **ed,
                                         size_t *nd)
{
    struct twin_capture *c = NULL;
    struct twin_stream *f;
    cudaError_t rc = cudaErrorInvalidValue;
    size_t n = 0;
    pthread_mutex_lock(&q_mu);
    if (st != NULL && (ed == NULL || deps != NULL))
        rc = capture_status_locked(s, st, &c);
    f = c != NULL ? resolve_locked(s) : NULL;
    n = f != NULL ? f->deps.n : 0;
    if (rc == cudaSuccess && ed != NULL && n > edge_cap) {
        cudaGraphEdgeData *grown = realloc(edge_buf, n * sizeof(*grown));
        if (grown == NULL) {
            rc = cudaErrorMemoryAllocation;
        } else {
            edge_buf = grown;
            edge_cap = n;
        }
    }
    if (rc == cudaSuccess) {
        if (id != NULL) *id = c != NULL ? c->id : 0;
        if (g != NULL) *g = c != NULL ? (cudaGraph_t)c->graph : NULL;
        if (deps != NULL) *deps = f != NULL ? (const cudaGraphNode_t *)f->deps.v : NULL;
        if (ed != NULL) *ed = n > 0 ? memset(edge_buf, 0, n * sizeof(*edge_buf)) : NULL;
        if (nd != NULL) *nd = n;
    }
    pthread_mutex_unlock(&q_mu);
    return rc == cudaSuccess ? cudaSuccess : fail(rc);
}

/* Sets the calling thread's mode and writes its previous one back (cuda_runtime_api.h 13.0). */
API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m)
{
    enum cudaStreamCaptureMode prev = thread_mode;
    if (m == NULL || (unsigned)*m > cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue);
    thread_mode = *m;
    *m = prev;
    return cudaSuccess;
}
