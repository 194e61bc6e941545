/*
 * Stand-in libcudart.so.13 for the twin, part 3: the stream and event API (see cudart.c for the model,
 * cudart_streams.c for the queues behind it).  Not NVIDIA's library.  While a stream captures
 * (cudart_capture.c), work placed on it is recorded, and the calls that would observe or wait for its work
 * are refused as the CUDA C++ Programming Guide 13.0 "Stream Capture" section says ("Prohibited and
 * Unhandled Operations"): querying or synchronising a capturing stream, its device, or an event last recorded
 * in a capture.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "cudart_twin.h"

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
/* A capturing stream may not be queried or synchronised (its work is not scheduled), nor the device while one
 * of its streams captures: cudaErrorStreamCaptureUnsupported, and the capture is invalidated (CUDA C++
 * Programming Guide 13.0, "Stream Capture": "Prohibited and Unhandled Operations", "Invalidation"). */
API cudaError_t cudaStreamQuery(cudaStream_t s)
{
    struct twin_stream *f;
    cudaError_t rc = cudaSuccess;
    int idle = 1;
    pthread_mutex_lock(&q_mu);
    if ((f = resolve_locked(s)) != NULL && (rc = capture_sync_check_locked(f, -1)) == cudaSuccess)
        idle = f->done == f->enq;
    pthread_mutex_unlock(&q_mu);
    if (rc != cudaSuccess)
        return fail(rc);
    return idle ? cudaSuccess : cudaErrorNotReady; /* not-ready is not an error: last error untouched */
}
API cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    struct twin_stream *f;
    cudaError_t rc = cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&q_mu);
    if ((f = resolve_locked(s)) != NULL)
        rc = capture_sync_check_locked(f, -1);
    pthread_mutex_unlock(&q_mu);
    if (rc != cudaSuccess)
        return fail(rc);
    drain(-1, f->legacy, f);
    return cudaSuccess;
}
API cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t rc;
    T();
    pthread_mutex_lock(&q_mu);
    rc = capture_sync_check_locked(NULL, cur_dev);
    pthread_mutex_unlock(&q_mu);
    if (rc != cudaSuccess)
        return fail(rc);
    drain(cur_dev, 0, NULL);
    return cudaSuccess;
}
/* An event recorded in a capture, or a capturing stream: a dependency in the capture's graph, no wait
 * (cudart_capture.c capture_wait_locked); otherwise the stream waits for the event's record. */
API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    struct twin_event *ev = (struct twin_event *)e;
    struct twin_stream *f;
    cudaError_t rc = cudaSuccess;
    TWIN_COUNT(TWIN_STREAM_WAITS);
    if (ev == NULL || ev->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&q_mu);
    if ((f = resolve_locked(s)) == NULL)
        rc = cudaErrorInvalidResourceHandle;
    else if ((rc = capture_gate_locked(f)) == cudaSuccess) {
        if (ev->cap_id != 0 || f->cap != NULL)
            rc = capture_wait_locked(f, ev, flags);
        else if (ev->rec_on != NULL)
            rc = push_wait_locked(f, ev->rec_on, ev->rec_pos);
    }
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
    event_release_locked(ev);
    pthread_mutex_unlock(&q_mu);
    return cudaSuccess;
}
void event_release_locked(struct twin_event *ev)
{
    if (--ev->refs == 0) {
        deps_clear(&ev->deps);
        free(ev);
    }
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
/* cudaEventRecordExternal makes a record node in a capture (CUDA 13.0); here it is a plain record: torch 2.11
 * passes it only for torch.cuda.Event(external=True). */
API cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int f) { (void)f; TWIN_COUNT(TWIN_EVENT_RECORDS); return event_record(e, s); }

int event_done_locked(const struct twin_event *ev)
{
    return ev->rec_on == NULL || ev->rec_on->done >= ev->rec_pos;
}
/* An event last recorded in a capture stands for no scheduled work: querying, synchronising with or timing it
 * is cudaErrorCapturedEvent ("not permitted on an event which was last recorded in a capturing stream",
 * driver_types.h 13.0) until it is recorded again outside a capture. */
API cudaError_t cudaEventQuery(cudaEvent_t e)
{
    struct twin_event *ev = (struct twin_event *)e;
    int done, captured;
    if (ev == NULL || ev->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&q_mu);
    done = event_done_locked(ev);
    captured = ev->cap_id != 0;
    pthread_mutex_unlock(&q_mu);
    if (captured)
        return fail(cudaErrorCapturedEvent);
    return done ? cudaSuccess : cudaErrorNotReady; /* not-ready is not an error: last error untouched */
}
API cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    struct twin_event *ev = (struct twin_event *)e;
    int captured;
    if (ev == NULL || ev->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&q_mu);
    while (ev->cap_id == 0 && !event_done_locked(ev))
        pthread_cond_wait(&q_cv, &q_mu);
    captured = ev->cap_id != 0;
    pthread_mutex_unlock(&q_mu);
    return captured ? fail(cudaErrorCapturedEvent) : cudaSuccess;
}
API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    struct twin_event *x = (struct twin_event *)a, *y = (struct twin_event *)b;
    int done, captured;
    if (x == NULL || y == NULL || x->magic != EVENT_MAGIC || y->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    /* cudaEventDisableTiming events cannot be timed (cuda_runtime_api.h 13.0, cudaEventElapsedTime) */
    if ((x->flags | y->flags) & cudaEventDisableTiming)
        return fail(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&q_mu);
    done = event_done_locked(x) && event_done_locked(y);
    captured = x->cap_id != 0 || y->cap_id != 0;
    pthread_mutex_unlock(&q_mu);
    if (captured)
        return fail(cudaErrorCapturedEvent);
    if (!done)
        return fail(cudaErrorNotReady);
    *ms = (float)(y->t_ms - x->t_ms);
    return cudaSuccess;
}

