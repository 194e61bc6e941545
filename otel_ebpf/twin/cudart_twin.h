/*
 * Internal header of the twin's stand-in libcudart.so.13 (cudart.c: devices, errors, memory; cudart_streams.c:
 * streams, events and their worker threads; cudart_kernels.c: launches, module registration, graphs).  None of
 * these names is exported: the version script (otel_ebpf/twin/build.py) exports cuda* and __cuda* only.
 */
#ifndef OTEL_EBPF_TWIN_CUDART_H
#define OTEL_EBPF_TWIN_CUDART_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#define API __attribute__((visibility("default")))
#define T() twin_trace(__func__)

/* cudart.c */
/* Calls counted per exported entry, reported at exit with the launch count (OTEL_EBPF_TWIN_STATS): a test
 * compares them with what a tracer counted. Each exported entry counts itself once and calls no other one. */
enum twin_counter { TWIN_MEMSETS, TWIN_EVENT_RECORDS, TWIN_STREAM_WAITS, TWIN_COUNTERS };
extern long twin_counts[TWIN_COUNTERS];
#define TWIN_COUNT(k) __atomic_add_fetch(&twin_counts[(k)], 1, __ATOMIC_RELAXED)
int twin_tracing(void);            /* OTEL_EBPF_TWIN_TRACE=1: log calls to stderr */
void twin_trace(const char *fn);
extern __thread int cur_dev;       /* the calling thread's current device (cudaSetDevice is per host thread) */
cudaError_t fail(cudaError_t e);   /* returned now and kept for cudaGetLastError, as the real runtime does */
cudaError_t do_free(void *p);      /* unmaps an allocation of the registry at once */
double now_ms(void);               /* CLOCK_MONOTONIC, ms */

/* cudart_streams.c: one piece of stream-ordered work */
struct twin_event;
struct twin_stream;
enum op_kind { OP_COPY, OP_SET, OP_RECORD, OP_WAIT, OP_HOST, OP_CALLBACK, OP_FREE };
struct op {
    enum op_kind kind;
    uint64_t pos; /* its place on its stream: it runs once the stream's `done` is pos - 1 */
    struct op *next;
    union {
        struct { void *d; const void *s; size_t w, h, dp, sp; } copy; /* rows of w bytes (h = 1: a plain copy) */
        struct { void *d; int v; size_t n; } set;
        struct { struct twin_event *e; } rec;
        struct { struct twin_stream *s; uint64_t upto; } wait; /* until s has done its op `upto` */
        struct { void (*fn)(void *); void *arg; } host;
        struct { cudaStreamCallback_t cb; cudaStream_t handle; void *arg; } callback;
        struct { void *p; } free;
    } u;
};
struct op *new_op(enum op_kind k);
/* Places `o` (taken over) on stream handle `s`: run here when that stream is idle and `inline_ok`, else by its
 * worker; with `host_wait` the call returns once it is done. */
cudaError_t submit(cudaStream_t s, struct op *o, int inline_ok, int host_wait);
/* Blocks until every op placed so far is done on: every stream (dev -1, only NULL), the streams of device
 * `dev`, or `only` (with `legacy_rules`, also the blocking streams of its device). */
void drain(int dev, int legacy_rules, struct twin_stream *only);

#endif
