/*
 * Stand-in libcudart.so.13 for the twin, part 2: streams and events (see cudart.c for the model).  Not
 * NVIDIA's library.  Each stream is a FIFO of ops drained in order by its own worker thread; one lock and one
 * condition serve every stream of the process.  __cudaTwinLaunch is the stand-in libnccl.so.2's way in.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_twin.h"

/* ---- streams: FIFO queues of work, each drained in order by its own worker thread ---- */

#define STREAM_MAGIC 0x5354524d5457494eULL
#define MAX_DEVICES 64
struct twin_stream {
    uint64_t magic;
    int dev, prio;
    unsigned flags;
    int legacy;            /* the device's legacy default stream */
    uint64_t enq, done;    /* ops placed so far; ops finished so far (done <= enq; idle when equal) */
    struct op *head, *tail;
    int has_worker;
    struct twin_stream *next_all;
};
#define EVENT_MAGIC 0x45564e545457494eULL
struct twin_event {
    uint64_t magic;
    double t_ms;
    unsigned flags;
    int refs;                     /* the handle, plus each record op not yet run */
    struct twin_stream *rec_on;   /* the stream of the last cudaEventRecord (NULL: never recorded) */
    uint64_t rec_pos;             /* that record's place on it: the event is complete once it is done */
};

/* One lock and one condition for all streams of the process: waits are few and short-lived. */
static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;
static struct twin_stream *all_streams;
static struct twin_stream *legacy_streams[MAX_DEVICES];
static __thread struct twin_stream *per_thread_streams[MAX_DEVICES];

static struct twin_stream *stream_alloc_locked(int dev, unsigned flags, int prio, int legacy)
{
    struct twin_stream *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return NULL;
    *f = (struct twin_stream){ .magic = STREAM_MAGIC, .dev = dev, .prio = prio, .flags = flags, .legacy = legacy };
    f->next_all = all_streams;
    all_streams = f;
    return f;
}

static struct twin_stream *stream_of(cudaStream_t s)
{
    struct twin_stream *f = (struct twin_stream *)s;
    return (uintptr_t)f > 16 && f->magic == STREAM_MAGIC ? f : NULL;
}

/* The stream a handle names, under q_mu: 0 and cudaStreamLegacy are the current device's legacy default
 * stream, cudaStreamPerThread this thread's (driver_types.h 13.0); NULL for a handle that is no stream. */
static struct twin_stream *resolve_locked(cudaStream_t s)
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
static void run_op(struct op *o)
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
    }
}

/* After an op ran, under q_mu: its stream moves on, and an event whose handle is gone is freed. */
static void finish_locked(struct twin_stream *f, struct op *o)
{
    f->done = o->pos;
    if (o->kind == OP_RECORD && --o->u.rec.e->refs == 0)
        free(o->u.rec.e);
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

static cudaError_t push_wait_locked(struct twin_stream *f, struct twin_stream *on, uint64_t upto)
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

/* Places `o` (heap-allocated, taken over) on stream handle `s`.  When that stream is idle and has nothing
 * to wait for, the op runs here and now (`inline_ok`); otherwise its worker runs it later.  With `host_wait`
 * the call returns once the op is done (a host-synchronous API).  `o` is gone when this returns. */
cudaError_t submit(cudaStream_t s, struct op *o, int inline_ok, int host_wait)
{
    struct twin_stream *f;
    cudaError_t rc;
    uint64_t pos;
    pthread_mutex_lock(&q_mu);
    if ((f = resolve_locked(s)) == NULL) {
        pthread_mutex_unlock(&q_mu);
        if (o->kind == OP_RECORD)
            o->u.rec.e->refs--;
        free(o);
        return fail(s == NULL || (uintptr_t)s <= 16 ? cudaErrorMemoryAllocation : cudaErrorInvalidResourceHandle);
    }
    if ((rc = implicit_waits_locked(f)) == cudaSuccess && inline_ok && f->enq == f->done) {
        o->pos = ++f->enq; /* placed but not queued: later ops on f wait for it (ready_locked) */
        if (o->kind == OP_RECORD) {
            o->u.rec.e->rec_on = f;
            o->u.rec.e->rec_pos = o->pos;
        }
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
        pthread_mutex_unlock(&q_mu);
        if (o->kind == OP_RECORD)
            o->u.rec.e->refs--;
        free(o);
        return fail(rc);
    }
    if (o->kind == OP_RECORD) {
        o->u.rec.e->rec_on = f;
        o->u.rec.e->rec_pos = o->pos;
    }
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

/* Private to the twin's libnccl.so.2 (nccl_twin.h): runs fn(arg) as one piece of work on streams[0] once
 * every one of the `n` streams has finished the work placed on it so far, and makes streams[1..n-1] wait
 * for it, as NCCL 2.28.9 src/enqueue.cc ncclLaunchPrepare joins a group's user streams onto the first one
 * (ncclStreamWaitStream) and, after the launch, makes the others wait for it (ncclLaunchFinish).  It also
 * runs after the last work launched for each of the `norders` communicators, and becomes their last: NCCL
 * orders all work of a communicator, whatever the user streams, through its device stream
 * (comm->sharedRes->deviceStream, a strong stream the launch stream waits for and then joins).  Never runs
 * fn inline: the caller returns while the work waits for its peers, as after a kernel launch.  Not a CUDA
 * API; no torch library imports it. */
API cudaError_t __cudaTwinLaunch(const cudaStream_t *streams, int n, struct twin_order *const *orders, int norders,
                                 void (*fn)(void *), void *arg)
{
    struct twin_stream *first, *f;
    struct op *o = new_op(OP_HOST);
    cudaError_t rc = cudaSuccess;
    if (o == NULL || n < 1) {
        free(o);
        return fail(n < 1 ? cudaErrorInvalidValue : cudaErrorMemoryAllocation);
    }
    o->u.host.fn = fn;
    o->u.host.arg = arg;
    pthread_mutex_lock(&q_mu);
    if ((first = resolve_locked(streams[0])) == NULL)
        rc = cudaErrorInvalidResourceHandle;
    for (int i = 1; i < n && rc == cudaSuccess; i++)
        rc = (f = resolve_locked(streams[i])) == NULL ? cudaErrorInvalidResourceHandle
                                                      : push_wait_locked(first, f, f->enq);
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
        rc = push_wait_locked(resolve_locked(streams[i]), first, first->enq);
    pthread_mutex_unlock(&q_mu);
    return rc == cudaSuccess ? cudaSuccess : fail(rc);
}

/* ---- stream API ---- */
static cudaError_t new_stream(cudaStream_t *s, unsigned flags, int prio)
{
    struct twin_stream *f;
    pthread_mutex_lock(&q_mu);
    f = stream_alloc_locked(cur_dev, flags, prio, 0);
    pthread_mutex_unlock(&q_mu);
    if (f == NULL)
        return fail(cudaErrorMemoryAllocation);
    *s = (cudaStream_t)f;
    return cudaSuccess;
}
API cudaError_t cudaStreamCreate(cudaStream_t *s) { T(); return new_stream(s, 0, 0); }
API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int f) { T(); return new_stream(s, f, 0); }
API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int f, int prio) { T(); return new_stream(s, f, prio); }
/* The handle stops being a stream at once; work already placed on it still runs (CUDA Runtime API 13.0,
 * cudaStreamDestroy: "resources ... released automatically once the device has completed all work"). */
API cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    struct twin_stream *f = stream_of(s);
    T();
    if (f == NULL)
        return fail(cudaErrorInvalidResourceHandle);
    f->magic = 0;
    return cudaSuccess;
}
API cudaError_t cudaStreamGetPriority(cudaStream_t s, int *prio)
{
    struct twin_stream *f = stream_of(s);
    *prio = f != NULL ? f->prio : 0;
    return cudaSuccess;
}
API cudaError_t cudaStreamQuery(cudaStream_t s)
{
    struct twin_stream *f;
    int idle;
    pthread_mutex_lock(&q_mu);
    f = resolve_locked(s);
    idle = f == NULL || f->done == f->enq;
    pthread_mutex_unlock(&q_mu);
    return idle ? cudaSuccess : cudaErrorNotReady; /* not-ready is not an error: last error untouched */
}
API cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    struct twin_stream *f;
    pthread_mutex_lock(&q_mu);
    f = resolve_locked(s);
    pthread_mutex_unlock(&q_mu);
    if (f == NULL)
        return fail(cudaErrorInvalidResourceHandle);
    drain(-1, f->legacy, f);
    return cudaSuccess;
}
API cudaError_t cudaDeviceSynchronize(void)
{
    T();
    drain(cur_dev, 0, NULL);
    return cudaSuccess;
}
API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    struct twin_event *ev = (struct twin_event *)e;
    struct twin_stream *f;
    cudaError_t rc = cudaSuccess;
    (void)flags;
    TWIN_COUNT(TWIN_STREAM_WAITS);
    if (ev == NULL || ev->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&q_mu);
    if ((f = resolve_locked(s)) == NULL)
        rc = cudaErrorInvalidResourceHandle;
    else if (ev->rec_on != NULL)
        rc = push_wait_locked(f, ev->rec_on, ev->rec_pos);
    pthread_mutex_unlock(&q_mu);
    return rc == cudaSuccess ? cudaSuccess : fail(rc);
}
/* Host functions run on the stream's worker once prior work is done (a GPU runs them on a runtime thread). */
API cudaError_t cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t cb, void *ud, unsigned int f)
{
    struct op *o = new_op(OP_CALLBACK);
    T();
    (void)f;
    if (o == NULL)
        return fail(cudaErrorMemoryAllocation);
    o->u.callback.cb = cb;
    o->u.callback.handle = s;
    o->u.callback.arg = ud;
    return submit(s, o, 0, 0);
}
API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *ud)
{
    struct op *o = new_op(OP_HOST);
    T();
    if (o == NULL)
        return fail(cudaErrorMemoryAllocation);
    o->u.host.fn = fn;
    o->u.host.arg = ud;
    return submit(s, o, 0, 0);
}

/* ---- events: complete once their stream has reached their last record ---- */
API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int f)
{
    struct twin_event *ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        return fail(cudaErrorMemoryAllocation);
    *ev = (struct twin_event){ .magic = EVENT_MAGIC, .t_ms = now_ms(), .flags = f, .refs = 1 };
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}
API cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
/* Destroying an event whose record is pending is allowed; it is freed once the record has run. */
API cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    struct twin_event *ev = (struct twin_event *)e;
    if (ev == NULL || ev->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&q_mu);
    ev->magic = 0;
    if (--ev->refs == 0)
        free(ev);
    pthread_mutex_unlock(&q_mu);
    return cudaSuccess;
}
static cudaError_t event_record(cudaEvent_t e, cudaStream_t s)
{
    struct twin_event *ev = (struct twin_event *)e;
    struct op *o;
    if (ev == NULL || ev->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    if ((o = new_op(OP_RECORD)) == NULL)
        return fail(cudaErrorMemoryAllocation);
    o->u.rec.e = ev;
    pthread_mutex_lock(&q_mu);
    ev->refs++;
    pthread_mutex_unlock(&q_mu);
    return submit(s, o, 1, 0);
}
API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { TWIN_COUNT(TWIN_EVENT_RECORDS); return event_record(e, s); }
API cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int f) { (void)f; TWIN_COUNT(TWIN_EVENT_RECORDS); return event_record(e, s); }

static int event_done_locked(const struct twin_event *ev)
{
    return ev->rec_on == NULL || ev->rec_on->done >= ev->rec_pos;
}
API cudaError_t cudaEventQuery(cudaEvent_t e)
{
    struct twin_event *ev = (struct twin_event *)e;
    int done;
    if (ev == NULL || ev->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&q_mu);
    done = event_done_locked(ev);
    pthread_mutex_unlock(&q_mu);
    return done ? cudaSuccess : cudaErrorNotReady; /* not-ready is not an error: last error untouched */
}
API cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    struct twin_event *ev = (struct twin_event *)e;
    if (ev == NULL || ev->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&q_mu);
    while (!event_done_locked(ev))
        pthread_cond_wait(&q_cv, &q_mu);
    pthread_mutex_unlock(&q_mu);
    return cudaSuccess;
}
API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    struct twin_event *x = (struct twin_event *)a, *y = (struct twin_event *)b;
    int done;
    if (x == NULL || y == NULL || x->magic != EVENT_MAGIC || y->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    /* cudaEventDisableTiming events cannot be timed (cuda_runtime_api.h 13.0, cudaEventElapsedTime) */
    if ((x->flags | y->flags) & cudaEventDisableTiming)
        return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&q_mu);
    done = event_done_locked(x) && event_done_locked(y);
    pthread_mutex_unlock(&q_mu);
    if (!done)
        return fail(cudaErrorNotReady);
    *ms = (float)(y->t_ms - x->t_ms);
    return cudaSuccess;
}

