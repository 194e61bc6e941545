/*
 * Internal header of the twin's stand-in libcudart.so.13 (cudart.c: devices, errors, memory; cudart_streams.c:
 * streams' queues and worker threads; cudart_stream_api.c: the stream and event API; cudart_capture.c: capture;
 * cudart_graphs.c: graphs and their replay; cudart_kernels.c: launches, module registration).  None of these
 * names is exported: the version script (otel_ebpf/twin/build.py) exports cuda* and __cuda* only.
 */
#ifndef OTEL_EBPF_TWIN_CUDART_H
#define OTEL_EBPF_TWIN_CUDART_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define API __attribute__((visibility("default")))
#define T() twin_trace(__func__)

/* cudart.c */
/* Calls counted per exported entry, reported at exit with the launch count (OTEL_EBPF_TWIN_STATS): a test
 * compares them with what a tracer counted. Each exported entry counts itself once and calls no other one.
 * Three count graphs: launch calls recorded into a graph (also in the launch count), successful
 * cudaGraphLaunch calls, and kernel nodes run by those launches; TWIN_COPIES counts cudaMemcpy and
 * cudaMemcpyAsync calls (the entry points the agent probes; the 2-D and peer copies are not counted). */
enum twin_counter {
    TWIN_MEMSETS, TWIN_EVENT_RECORDS, TWIN_STREAM_WAITS, TWIN_CAPTURED_LAUNCHES, TWIN_GRAPH_LAUNCHES,
    TWIN_GRAPH_KERNELS, TWIN_COPIES, TWIN_COUNTERS
};
extern long twin_counts[TWIN_COUNTERS];
#define TWIN_COUNT(k) __atomic_add_fetch(&twin_counts[(k)], 1, __ATOMIC_RELAXED)
int twin_tracing(void);            /* OTEL_EBPF_TWIN_TRACE=1: log calls to stderr */
void twin_trace(const char *fn);
extern __thread int cur_dev;       /* the calling thread's current device (cudaSetDevice is per host thread) */
cudaError_t fail(cudaError_t e);   /* returned now and kept for cudaGetLastError, as the real runtime does */
cudaError_t do_free(void *p);      /* unmaps an allocation of the registry at once */
double now_ms(void);               /* CLOCK_MONOTONIC, ms */

/* ---- streams, events and the work placed on them (cudart_streams.c, cudart_stream_api.c) ---- */
struct twin_capture;
struct twin_gnode;
/* A set of graph nodes (a capturing stream's or a captured event's dependencies), grown by realloc. */
struct twin_deps {
    struct twin_gnode **v;
    size_t n, cap;
};

#define STREAM_MAGIC 0x5354524d5457494eULL
#define MAX_DEVICES 64
struct op;
struct twin_stream {
    uint64_t magic;
    int dev, prio;
    unsigned flags;
    int legacy;            /* the device's legacy default stream */
    uint64_t enq, done;    /* ops placed so far; ops finished so far (done <= enq; idle when equal) */
    struct op *head, *tail;
    int has_worker;
    struct twin_stream *next_all;
    struct twin_capture *cap; /* the capture it takes part in (cudart_capture.c); NULL: work runs */
    struct twin_deps deps;    /* while capturing: the nodes its next captured node depends on */
};
#define EVENT_MAGIC 0x45564e545457494eULL
struct twin_event {
    uint64_t magic;
    double t_ms;
    unsigned flags;
    int refs;                     /* the handle, plus each record op not yet run */
    struct twin_stream *rec_on;   /* the stream of the last cudaEventRecord (NULL: never recorded) */
    uint64_t rec_pos;             /* that record's place on it: the event is complete once it is done */
    unsigned long long cap_id;    /* last recorded in the capture with this id (0: not in a capture) */
    struct twin_deps deps;        /* that record's dependencies in the capture's graph */
};

enum op_kind { OP_COPY, OP_SET, OP_RECORD, OP_WAIT, OP_HOST, OP_CALLBACK, OP_FREE, OP_KERNEL };
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
        struct { unsigned us; } kernel; /* OTEL_EBPF_TWIN_KERNEL_US: a launch's modelled device time */
    } u;
};
struct op *new_op(enum op_kind k);
/* Runs one op's work on the calling thread (no lock held): a stream's worker, or a graph's replay. */
void run_op(struct op *o);
/* Places `o` (taken over) on stream handle `s`: run here when that stream is idle and `inline_ok`, else by its
 * worker; with `host_wait` the call returns once it is done.  On a capturing stream it is recorded instead. */
cudaError_t submit(cudaStream_t s, struct op *o, int inline_ok, int host_wait);
/* Blocks until every op placed so far is done on: every stream (dev -1, only NULL), the streams of device
 * `dev`, or `only` (with `legacy_rules`, also the blocking streams of its device). */
void drain(int dev, int legacy_rules, struct twin_stream *only);

/* One lock and one condition for all streams, events, captures and graphs of the process (cudart_streams.c). */
extern pthread_mutex_t q_mu;
extern pthread_cond_t q_cv;
extern struct twin_stream *all_streams;        /* under q_mu */
struct twin_stream *resolve_locked(cudaStream_t s); /* NULL: the handle is no stream */
struct twin_stream *stream_of(cudaStream_t s);      /* a created stream's handle, else NULL */
struct twin_stream *stream_alloc_locked(int dev, unsigned flags, int prio, int legacy);
/* Makes f's next work wait until `on` has done its op `upto` (nothing when already so, or on == f). */
cudaError_t push_wait_locked(struct twin_stream *f, struct twin_stream *on, uint64_t upto);
int event_done_locked(const struct twin_event *ev);
void event_release_locked(struct twin_event *ev);  /* drops one reference; the last frees it */

/* ---- stream capture (cudart_capture.c); all *_locked under q_mu ---- */
extern int twin_active_captures; /* read without the lock as a fast path: 0 means no stream captures */
/* cudaSuccess when work may be placed on f now; else the error (the capture it breaks is invalidated): the
 * legacy stream while a blocking stream of its device captures, or f's capture already invalidated. */
cudaError_t capture_gate_locked(struct twin_stream *f);
/* f captures: records `o` as a node (no op for an event record: the event is marked captured); host-synchronous
 * work is refused.  `o` stays the caller's. */
cudaError_t capture_op_locked(struct twin_stream *f, const struct op *o, int host_wait);
/* Appends a node after the dependencies of all `n` streams (of one capture), which then depend on it alone. */
cudaError_t capture_node_locked(struct twin_stream *const *fs, int n, const struct twin_gnode *proto);
/* cudaStreamWaitEvent(f, ev) where ev was recorded in a capture or f captures: joins or merges dependencies. */
cudaError_t capture_wait_locked(struct twin_stream *f, struct twin_event *ev, unsigned flags);
/* Host synchronisation with f (cudaStreamSynchronize/Query) or with the device (dev >= 0): refused while a
 * stream of it captures, as the CUDA Programming Guide's "Prohibited and Unhandled Operations" say. */
cudaError_t capture_sync_check_locked(struct twin_stream *f, int dev);
/* A "potentially unsafe" call (cudaMalloc, cudaFree...) under the thread's capture mode: takes q_mu itself. */
cudaError_t capture_unsafe_call(void);
/* Kernel launches (cudart_kernels.c): a node when `st` captures; takes q_mu itself, only while captures exist. */
cudaError_t capture_launch(cudaStream_t st);

/* ---- graphs (cudart_graphs.c) ---- */
/* Dependency sets: 0, or -1 when out of memory (the set is then partial). */
void deps_clear(struct twin_deps *d);
int deps_add(struct twin_deps *d, struct twin_gnode *n);         /* n once */
int deps_merge(struct twin_deps *d, const struct twin_deps *from); /* d |= from */
int deps_set(struct twin_deps *d, const struct twin_deps *from);   /* d = from (not aliased) */
/* What NCCL's persistent work is tied to: freed by `destroy` when the last graph or exec holding it goes (CUDA
 * user objects, cudaUserObjectCreate + cudaGraphRetainUserObject, which NCCL 2.28.9 src/misc/strongstream.cc
 * ncclCudaGraphAddDestructor uses). */
struct twin_uobj {
    int refs;
    void (*destroy)(void *);
    void *arg;
};
enum gnode_kind { GN_KERNEL, GN_OP };
struct twin_gnode {
    enum gnode_kind kind;
    struct op op;           /* GN_OP: the work (OP_COPY, OP_SET, OP_HOST, OP_CALLBACK, OP_FREE) */
    struct twin_uobj *obj;  /* owns op.u.host.arg (NCCL's persistent group), or NULL */
    size_t index;           /* its place in its graph: capture order */
    struct twin_deps deps;  /* the nodes it depends on (all earlier in capture order) */
};
struct twin_graph;
struct twin_graph *graph_new(void);
void graph_free(struct twin_graph *g);  /* with its nodes; no lock needed (the graph is nobody else's) */
void graph_set_capturing(struct twin_graph *g, int on);
/* A copy of `proto` appended to g with `deps` (copied); its handle in *out. */
cudaError_t graph_add_locked(struct twin_graph *g, const struct twin_gnode *proto, const struct twin_deps *deps,
                             struct twin_gnode **out);
/* Whether every node of `tails` is, or is an ancestor of, a node of `heads` (cudaErrorStreamCaptureUnjoined). */
int graph_joined_locked(struct twin_graph *g, const struct twin_deps *heads, const struct twin_deps *tails);
struct twin_uobj *uobj_new(void (*destroy)(void *), void *arg);
void uobj_release(struct twin_uobj *o);

#endif
