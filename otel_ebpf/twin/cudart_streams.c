/*
 * Stand-in libcudart.so.13 for the twin, part 2: streams' queues and worker threads (see cudart.c for the model;
 * cudart_stream_api.c holds the stream and event API).  Not NVIDIA's library.  Each stream is a FIFO of ops
 * drained in order by its own worker thread; one lock and one condition serve every stream of the process.
 * Work placed on a capturing stream is recorded into its capture's graph instead (cudart_capture.c).
 * __cudaTwinLaunch is the stand-in libnccl.so.2's way in.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudart_twin.h"

/* ---- streams: FIFO queues of work, each drained in order by its own worker thread ---- */

/* One lock and one condition for all streams of the process: waits are few and short-lived. */
pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;
struct twin_stream *all_streams;
static struct twin_stream *legacy_streams[MAX_DEVICES];
static __thread struct twin_stream *per_thread_streams[MAX_DEVICES];

struct twin_stream *stream_alloc_locked(int dev, unsigned flags, int prio, int legacy)
{
    struct twin_stream *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return NULL;
    *f = (struct twin_stream){ .magic = STREAM_MAGIC, .dev = dev, .prio = prio, .flags = flags, .legacy = legacy };
    f->next_all = all_streams;
    all_streams = f;
    return f;
}

struct twin_stream *stream_of(cudaStream_t s)
{
    struct twin_stream *f = (struct twin_stream *)s;
    return (uintptr_t)f > 16 && f->magic == STREAM_MAGIC ? f : NULL;
}

/* The stream a handle names, under q_mu: 0 and cudaStreamLegacy are the current device's legacy default
 * stream, cudaStreamPerThread this thread's (driver_types.h 13.0); NULL for a handle that is no stream. */
struct twin_stream *resolve_locked(cudaStream_t s)
{
    int dev = cur_dev >= 0 && cur_dev < MAX_DEVICES ? cur_dev : 0;
    if (s == NULL || s == cudaStreamLegacy) {
        if (legacy_streams[dev] == NULL)
            legacy_streams[dev] = stream_alloc_locked(dev, 0, 0, 1);
        return legacy_streams[dev];
    }
    if (s == cudaStreamPerThread) {
        if (per_thread_streams[dev] == NULL)
            per_thread_streams[dev] = stream_alloc_locked(dev, 0, 0, 0);
        return per_thread_streams[dev];
    }
    return stream_of(s);
}

static int blocking(const struct twin_stream *f) { return !(f->flags & cudaStreamNonBlocking); }

/* Runs one op's work (outside q_mu). */
void run_op(struct op *o)
{
    switch (o->kind) {
    case OP_COPY:
        for (size_t i = 0; i < o->u.copy.h; i++)
            if (o->u.copy.w)
                memmove((char *)o->u.copy.d + i * o->u.copy.dp, (const char *)o->u.copy.s + i * o->u.copy.sp,
                        o->u.copy.w);
        break;
    case OP_SET:
        if (o->u.set.n)
            memset(o->u.set.d, o->u.set.v, o->u.set.n);
        break;
    case OP_RECORD:
        o->u.rec.e->t_ms = now_ms();
        break;
    case OP_HOST:
        o->u.host.fn(o->u.host.arg);
        break;
    case OP_CALLBACK:
        o->u.callback.cb(o->u.callback.handle, cudaSuccess, o->u.callback.arg);
        break;
    case OP_FREE:
        do_free(o->u.free.p);
        break;
    case OP_WAIT:
        break;
    case OP_KERNEL: { /* the launch's modelled device time: the stream is busy, its worker sleeps */
        struct timespec ts = { o->u.kernel.us / 1000000u, (long)(o->u.kernel.us % 1000000u) * 1000L };
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        break;
    }
    }
}

/* After an op ran, under q_mu: its stream moves on, and an event whose handle is gone is freed. */
static void finish_locked(struct twin_stream *f, struct op *o)
{
    f->done = o->pos;
    if (o->kind == OP_RECORD)
        event_release_locked(o->u.rec.e);
    pthread_cond_broadcast(&q_cv);
}

static int ready_locked(const struct twin_stream *f, const struct op *o)
{
    return f->done == o->pos - 1 && (o->kind != OP_WAIT || o->u.wait.s->done >= o->u.wait.upto);
}

static void *stream_worker(void *arg)
{
    struct twin_stream *f = arg;
    pthread_mutex_lock(&q_mu);
    for (;;) {
        struct op *o = f->head;
        if (o == NULL || !ready_locked(f, o)) {
            pthread_cond_wait(&q_cv, &q_mu);
            continue;
        }
        f->head = o->next;
        if (f->head == NULL)
            f->tail = NULL;
        pthread_mutex_unlock(&q_mu);
        run_op(o);
        pthread_mutex_lock(&q_mu);
        finish_locked(f, o);
        free(o);
    }
    return NULL;
}

/* Appends an op to a stream, under q_mu, starting the stream's worker on first use. */
static cudaError_t push_locked(struct twin_stream *f, struct op *o)
{
    if (!f->has_worker) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 256 << 10);
        if (pthread_create(&t, &at, stream_worker, f) != 0) {
            pthread_attr_destroy(&at);
            return cudaErrorMemoryAllocation;
        }
        pthread_attr_destroy(&at);
        f->has_worker = 1;
    }
    o->pos = ++f->enq;
    o->next = NULL;
    if (f->tail != NULL)
        f->tail->next = o;
    else
        f->head = o;
    f->tail = o;
    pthread_cond_broadcast(&q_cv);
    return cudaSuccess;
}

cudaError_t push_wait_locked(struct twin_stream *f, struct twin_stream *on, uint64_t upto)
{
    struct op *w;
    if (on == f || on->done >= upto)
        return cudaSuccess; /* a stream's own work is in order already; finished work needs no wait */
    if ((w = calloc(1, sizeof(*w))) == NULL)
        return cudaErrorMemoryAllocation;
    w->kind = OP_WAIT;
    w->u.wait.s = on;
    w->u.wait.upto = upto;
    return push_locked(f, w);
}

/* The implicit waits of the legacy default stream, under q_mu: work on it waits for prior work on every
 * blocking stream of its device; work on a blocking stream waits for prior work on the legacy stream. */
static cudaError_t implicit_waits_locked(struct twin_stream *f)
{
    cudaError_t rc = cudaSuccess;
    if (f->legacy) {
        for (struct twin_stream *b = all_streams; b != NULL && rc == cudaSuccess; b = b->next_all)
            if (b != f && b->dev == f->dev && blocking(b) && b->magic == STREAM_MAGIC)
                rc = push_wait_locked(f, b, b->enq);
    } else if (blocking(f) && f->dev < MAX_DEVICES && legacy_streams[f->dev] != NULL) {
        rc = push_wait_locked(f, legacy_streams[f->dev], legacy_streams[f->dev]->enq);
    }
    return rc;
}

/* An op that will not run: an event record's reference goes with it. */
static void drop_op_locked(struct op *o)
{
    if (o->kind == OP_RECORD)
        event_release_locked(o->u.rec.e);
    free(o);
}

/* A record placed at o->pos on f: the event is complete once f gets there, and no longer a captured one. */
static void placed_locked(struct twin_stream *f, const struct op *o)
{
    if (o->kind != OP_RECORD)
        return;
    o->u.rec.e->rec_on = f;
    o->u.rec.e->rec_pos = o->pos;
    o->u.rec.e->cap_id = 0;
    deps_clear(&o->u.rec.e->deps);
}

/* Places `o` (heap-allocated, taken over) on stream handle `s`.  When that stream is idle and has nothing
 * to wait for, the op runs here and now (`inline_ok`); otherwise its worker runs it later.  With `host_wait`
 * the call returns once the op is done (a host-synchronous API).  On a capturing stream the op becomes a node
 * of the capture's graph instead, with no implicit wait (cudart_capture.c).  `o` is gone when this returns. */
cudaError_t submit(cudaStream_t s, struct op *o, int inline_ok, int host_wait)
{
    struct twin_stream *f;
    cudaError_t rc;
    uint64_t pos;
    pthread_mutex_lock(&q_mu);
    if ((f = resolve_locked(s)) == NULL) {
        rc = s == NULL || (uintptr_t)s <= 16 ? cudaErrorMemoryAllocation : cudaErrorInvalidResourceHandle;
    } else if ((rc = capture_gate_locked(f)) == cudaSuccess && f->cap != NULL) {
        rc = capture_op_locked(f, o, host_wait);
        drop_op_locked(o);
        pthread_mutex_unlock(&q_mu);
        return rc == cudaSuccess ? cudaSuccess : fail(rc);
    }
    if (rc == cudaSuccess)
        rc = implicit_waits_locked(f);
    if (rc == cudaSuccess && inline_ok && f->enq == f->done) {
        o->pos = ++f->enq; /* placed but not queued: later ops on f wait for it (ready_locked) */
        placed_locked(f, o);
        pthread_mutex_unlock(&q_mu);
        run_op(o);
        pthread_mutex_lock(&q_mu);
        finish_locked(f, o);
        pthread_mutex_unlock(&q_mu);
        free(o);
        return cudaSuccess;
    }
    if (rc == cudaSuccess)
        rc = push_locked(f, o);
    if (rc != cudaSuccess) {
        drop_op_locked(o);
        pthread_mutex_unlock(&q_mu);
        return fail(rc);
    }
    placed_locked(f, o);
    pos = o->pos; /* o may be freed by the worker from here on */
    while (host_wait && f->done < pos)
        pthread_cond_wait(&q_cv, &q_mu);
    pthread_mutex_unlock(&q_mu);
    return cudaSuccess;
}

/* Blocks until every op placed so far on the streams `match` selects is done. */
void drain(int dev, int legacy_rules, struct twin_stream *only)
{
    pthread_mutex_lock(&q_mu);
    for (struct twin_stream *f = all_streams; f != NULL; f = f->next_all) {
        uint64_t upto = f->enq;
        int mine = only != NULL ? f == only || (legacy_rules && f->dev == only->dev && blocking(f))
                                : dev < 0 || f->dev == dev;
        while (mine && f->done < upto)
            pthread_cond_wait(&q_cv, &q_mu);
    }
    pthread_mutex_unlock(&q_mu);
}

struct op *new_op(enum op_kind k)
{
    struct op *o = calloc(1, sizeof(*o));
    if (o != NULL)
        o->kind = k;
    return o;
}

/* The last work launched for one NCCL communicator (nccl_twin.h, same layout): read and moved under q_mu. */
struct twin_order { void *stream; uint64_t pos; };

/* The uncaptured launch (see __cudaTwinLaunch), under q_mu: `o` is taken over. */
static cudaError_t launch_locked(struct twin_stream *const *fs, int n, struct twin_order *const *orders, int norders,
                                 struct op *o)
{
    struct twin_stream *first = fs[0];
    cudaError_t rc = cudaSuccess;
    for (int i = 1; i < n && rc == cudaSuccess; i++)
        rc = push_wait_locked(first, fs[i], fs[i]->enq);
    for (int i = 0; i < norders && rc == cudaSuccess; i++)
        if (orders[i]->stream != NULL)
            rc = push_wait_locked(first, orders[i]->stream, orders[i]->pos);
    if (rc == cudaSuccess)
        rc = implicit_waits_locked(first);
    if (rc == cudaSuccess)
        rc = push_locked(first, o);
    else
        free(o);
    for (int i = 0; i < norders && rc == cudaSuccess; i++)
        *orders[i] = (struct twin_order){ first, first->enq };
    for (int i = 1; i < n && rc == cudaSuccess; i++)
        rc = push_wait_locked(fs[i], first, first->enq);
    return rc;
}

/* The captured launch (see __cudaTwinLaunch), under q_mu: one host node owning `arg`. */
static cudaError_t launch_captured_locked(struct twin_stream *const *fs, int n, void (*fn)(void *), void *arg,
                                          void (*destroy)(void *), int *captured)
{
    struct twin_gnode proto = { .kind = GN_OP, .op = { .kind = OP_HOST, .u.host = { fn, arg } } };
    cudaError_t rc;
    for (int i = 1; i < n; i++)
        if (fs[i]->cap != fs[0]->cap)
            return cudaErrorStreamCaptureIsolation;
    if ((proto.obj = uobj_new(destroy, arg)) == NULL)
        return cudaErrorMemoryAllocation;
    *captured = 1; /* before the node exists: its replays read it */
    if ((rc = capture_node_locked(fs, n, &proto)) != cudaSuccess) {
        *captured = 0;
        free(proto.obj); /* held by no node: `arg` stays the caller's */
    }
    return rc;
}

/* Private to the twin's libnccl.so.2 (nccl_twin.h): runs fn(arg) as one piece of work on streams[0] once
 * every one of the `n` streams has finished the work placed on it so far, and makes streams[1..n-1] wait
 * for it, as NCCL 2.28.9 src/enqueue.cc ncclLaunchPrepare joins a group's user streams onto the first one
 * (ncclStreamWaitStream) and, after the launch, makes the others wait for it (ncclLaunchFinish).  It also
 * runs after the last work launched for each of the `norders` communicators, and becomes their last: NCCL
 * orders all work of a communicator, whatever the user streams, through its device stream
 * (comm->sharedRes->deviceStream, a strong stream the launch stream waits for and then joins).  Never runs
 * fn inline: the caller returns while the work waits for its peers, as after a kernel launch.  *captured = 0.
 *
 * When the streams capture, the work is not placed: it becomes one host node of the capture's graph, after
 * the dependencies of all `n` streams, which then depend on it alone, so each replay of the graph runs
 * fn(arg) again; nothing is waited for and no communicator's order moves (a replay is ordered by the stream
 * it is launched on).  *captured = 1 (written before the node exists, so the caller may point it into `arg`),
 * and the graph owns `arg`: `destroy(arg)` runs when the last graph or graph exec holding the node is
 * destroyed, as NCCL 2.28.9 src/enqueue.cc makes a captured plan persistent and frees it through
 * ncclCudaGraphAddDestructor (a CUDA user object).  As its planner checks (src/enqueue.cc,
 * ncclCudaGetCapturingGraph / ncclCudaGraphSame: "Streams given to a communicator within a NCCL group must
 * either be all uncaptured or all captured by the same graph"), streams in different captures, or some
 * capturing and some not, give cudaErrorStreamCaptureIsolation.  Not a CUDA API; no torch library imports it. */
API cudaError_t __cudaTwinLaunch(const cudaStream_t *streams, int n, struct twin_order *const *orders, int norders,
                                 void (*fn)(void *), void *arg, void (*destroy)(void *), int *captured)
{
    struct twin_stream **fs = n >= 1 ? calloc((size_t)n, sizeof(*fs)) : NULL;
    struct op *o = new_op(OP_HOST);
    cudaError_t rc = cudaSuccess;
    int any_captures = 0;
    *captured = 0;
    if (o == NULL || fs == NULL) {
        free(o);
        free(fs);
        return fail(n < 1 ? cudaErrorInvalidValue : cudaErrorMemoryAllocation);
    }
    o->u.host.fn = fn;
    o->u.host.arg = arg;
    pthread_mutex_lock(&q_mu);
    for (int i = 0; i < n && rc == cudaSuccess; i++) {
        if ((fs[i] = resolve_locked(streams[i])) == NULL)
            rc = cudaErrorInvalidResourceHandle;
        else if ((rc = capture_gate_locked(fs[i])) == cudaSuccess)
            any_captures |= fs[i]->cap != NULL;
    }
    if (rc == cudaSuccess && any_captures) {
        rc = launch_captured_locked(fs, n, fn, arg, destroy, captured);
        free(o);
    } else if (rc == cudaSuccess) {
        rc = launch_locked(fs, n, orders, norders, o);
    } else {
        free(o);
    }
    pthread_mutex_unlock(&q_mu);
    free(fs);
    return rc == cudaSuccess ? cudaSuccess : fail(rc);
}
