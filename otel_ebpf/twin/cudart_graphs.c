/*
 * Stand-in libcudart.so.13 for the twin, part 5: graphs, as stream capture (cudart_capture.c) makes them, and
 * their replay.  Not NVIDIA's library.  The calls are those torch 2.11 makes (aten/src/ATen/cuda/CUDAGraph.cpp:
 * capture_end counts the nodes with cudaGraphGetNodes(graph, nullptr, &n) and warns "The CUDA Graph is empty"
 * at 0, instantiates with cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUseNodePriority,
 * destroys the graph at once; replay is cudaGraphLaunch(exec, current stream); reset destroys the exec).
 * Behaviour, from cuda_runtime_api.h 13.0:
 * - A graph holds its nodes in capture order, each with the nodes it depends on (cudaGraphGetNodes,
 *   cudaGraphNodeGetDependencies: a NULL array asks for the count; extra entries are set to NULL).
 * - cudaGraphInstantiate(WithFlags): an exec holding its own copy of the nodes, so the graph may be destroyed
 *   at once, as torch does.  cudaGraphLaunch(exec, s): one piece of work on s, asynchronous and ordered as any
 *   other (a GPU runs the graph after s's prior work, and s's later work after it); it runs every node in
 *   capture order, which respects every dependency: kernel nodes are counted (graph_kernels, kernels do
 *   nothing in the twin), copies, memsets, host functions and callbacks run, free nodes free.  So a captured
 *   all_reduce (the stand-in NCCL's host node) really moves the ranks' data again at each replay.
 * - What a node owns (NCCL's persistent group) is freed when the last graph or exec holding it is destroyed;
 *   an exec destroyed while launched lives until those launches have run.
 * Simplified (torch does not observe it): a replay runs its nodes one after another, with no concurrency
 * between independent branches; the instantiate flags are checked, not acted on (no device to upload to, no
 * graph allocations); launching a graph on a capturing stream (CUDA captures it as a child graph node) is
 * refused with cudaErrorStreamCaptureUnsupported; cudaGraphUpload and the node-editing API are not exported
 * (torch 2.11 does not import them).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudart_twin.h"

#define GRAPH_MAGIC 0x4850415247545749ULL
#define EXEC_MAGIC 0x4345584547545749ULL
/* A bound, not a model: a captured training step has thousands of nodes; beyond this, cudaErrorMemoryAllocation. */
#define TWIN_MAX_GRAPH_NODES ((size_t)1 << 22)

struct twin_graph {
    uint64_t magic;
    struct twin_gnode **nodes; /* capture order; each node is its own allocation (its handle stays valid) */
    size_t n, cap;
    int capturing;             /* a capture still records into it: it may not be destroyed */
};
struct twin_exec {
    uint64_t magic;
    struct twin_gnode *nodes;  /* copies: kind, op, obj (dependencies dropped: a replay keeps capture order) */
    size_t n;
    int refs;                  /* the handle, plus each launch not yet run */
};

/* ---- dependency sets ---- */
void deps_clear(struct twin_deps *d)
{
    free(d->v);
    *d = (struct twin_deps){ 0 };
}

int deps_add(struct twin_deps *d, struct twin_gnode *n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->v[i] == n)
            return 0;
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 4;
        struct twin_gnode **v = realloc(d->v, cap * sizeof(*v));
        if (v == NULL)
            return -1;
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = n;
    return 0;
}

int deps_merge(struct twin_deps *d, const struct twin_deps *from)
{
    for (size_t i = 0; i < from->n; i++)
        if (deps_add(d, from->v[i]) != 0)
            return -1;
    return 0;
}

int deps_set(struct twin_deps *d, const struct twin_deps *from)
{
    d->n = 0;
    return deps_merge(d, from);
}

/* ---- user objects ---- */
struct twin_uobj *uobj_new(void (*destroy)(void *), void *arg)
{
    struct twin_uobj *o = calloc(1, sizeof(*o));
    if (o != NULL)
        *o = (struct twin_uobj){ 0, destroy, arg }; /* each node holding it takes a reference */
    return o;
}

void uobj_release(struct twin_uobj *o)
{
    if (__atomic_sub_fetch(&o->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        o->destroy(o->arg);
        free(o);
    }
}

/* ---- graphs ---- */
struct twin_graph *graph_new(void)
{
    struct twin_graph *g = calloc(1, sizeof(*g));
    if (g != NULL)
        g->magic = GRAPH_MAGIC;
    return g;
}

void graph_set_capturing(struct twin_graph *g, int on) { g->capturing = on; }

void graph_free(struct twin_graph *g)
{
    for (size_t i = 0; i < g->n; i++) {
        deps_clear(&g->nodes[i]->deps);
        if (g->nodes[i]->obj != NULL)
            uobj_release(g->nodes[i]->obj);
        free(g->nodes[i]);
    }
    free(g->nodes);
    g->magic = 0;
    free(g);
}

cudaError_t graph_add_locked(struct twin_graph *g, const struct twin_gnode *proto, const struct twin_deps *deps,
                             struct twin_gnode **out)
{
    struct twin_gnode *n;
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        struct twin_gnode **grown = g->n < TWIN_MAX_GRAPH_NODES ? realloc(g->nodes, cap * sizeof(*grown)) : NULL;
        if (grown == NULL)
            return cudaErrorMemoryAllocation;
        g->nodes = grown;
        g->cap = cap;
    }
    if ((n = calloc(1, sizeof(*n))) == NULL)
        return cudaErrorMemoryAllocation;
    *n = *proto;
    n->index = g->n;
    n->deps = (struct twin_deps){ 0 };
    if (deps->n > 0) {
        if ((n->deps.v = malloc(deps->n * sizeof(*n->deps.v))) == NULL) {
            free(n);
            return cudaErrorMemoryAllocation;
        }
        memcpy(n->deps.v, deps->v, deps->n * sizeof(*n->deps.v));
        n->deps.n = n->deps.cap = deps->n;
    }
    if (n->obj != NULL)
        __atomic_add_fetch(&n->obj->refs, 1, __ATOMIC_ACQ_REL);
    g->nodes[g->n++] = n;
    *out = n;
    return cudaSuccess;
}

int graph_joined_locked(struct twin_graph *g, const struct twin_deps *heads, const struct twin_deps *tails)
{
    unsigned char *seen = calloc(g->n ? g->n : 1, 1);
    struct twin_gnode **stack = malloc((g->n ? g->n : 1) * sizeof(*stack));
    size_t top = 0;
    int joined = 1;
    if (seen == NULL || stack == NULL) {
        free(seen);
        free(stack);
        return 1; /* cannot tell: not an error of the caller's */
    }
    for (size_t i = 0; i < heads->n; i++)
        if (!seen[heads->v[i]->index]) {
            seen[heads->v[i]->index] = 1; /* each node is pushed once: the stack holds at most g->n */
            stack[top++] = heads->v[i];
        }
    while (top > 0) {
        struct twin_gnode *n = stack[--top];
        for (size_t i = 0; i < n->deps.n; i++)
            if (!seen[n->deps.v[i]->index]) {
                seen[n->deps.v[i]->index] = 1;
                stack[top++] = n->deps.v[i];
            }
    }
    for (size_t i = 0; i < tails->n && joined; i++)
        joined = seen[tails->v[i]->index] != 0;
    free(seen);
    free(stack);
    return joined;
}

static struct twin_graph *graph_of(cudaGraph_t g)
{
    struct twin_graph *x = (struct twin_graph *)g;
    return x != NULL && x->magic == GRAPH_MAGIC ? x : NULL;
}

/* Copies up to *n handles of `from` into `out` (NULL entries past the end), or only counts with out == NULL. */
static void fill_nodes(struct twin_gnode *const *from, size_t have, cudaGraphNode_t *out, cudaGraphEdgeData *ed,
                       size_t *n)
{
    if (out == NULL) {
        *n = have;
        return;
    }
    for (size_t i = 0; i < *n; i++) {
        out[i] = i < have ? (cudaGraphNode_t)from[i] : NULL;
        if (ed != NULL)
            memset(&ed[i], 0, sizeof(ed[i])); /* every captured edge is a default one */
    }
    *n = *n < have ? *n : have;
}

API cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n)
{
    struct twin_graph *x = graph_of(g);
    if (x == NULL || n == NULL)
        return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&q_mu);
    fill_nodes(x->nodes, x->n, nodes, NULL, n);
    pthread_mutex_unlock(&q_mu);
    return cudaSuccess;
}

API cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *d, cudaGraphEdgeData *e, size_t *nd)
{
    struct twin_gnode *x = (struct twin_gnode *)node;
    if (x == NULL || nd == NULL || (e != NULL && d == NULL))
        return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&q_mu);
    fill_nodes(x->deps.v, x->deps.n, d, e, nd);
    pthread_mutex_unlock(&q_mu);
    return cudaSuccess;
}

/* A graph a capture still records into may not be destroyed (cudaStreamGetCaptureInfo: "All operations other
 * than destroy and node removal are permitted on the graph while the capture sequence is in progress"). */
API cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    struct twin_graph *x = graph_of(g);
    int capturing;
    if (x == NULL)
        return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&q_mu);
    if (!(capturing = x->capturing))
        x->magic = 0;
    pthread_mutex_unlock(&q_mu);
    if (capturing)
        return fail(cudaErrorIllegalState);
    graph_free(x);
    return cudaSuccess;
}

/* ---- executable graphs ---- */
static struct twin_exec *exec_of(cudaGraphExec_t e)
{
    struct twin_exec *x = (struct twin_exec *)e;
    return x != NULL && x->magic == EXEC_MAGIC ? x : NULL;
}

static void exec_release(struct twin_exec *x)
{
    if (__atomic_sub_fetch(&x->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    for (size_t i = 0; i < x->n; i++)
        if (x->nodes[i].obj != NULL)
            uobj_release(x->nodes[i].obj);
    free(x->nodes);
    free(x);
}

/* One launch, on its stream's worker: every node in capture order, then the launch's reference goes. */
static void exec_run(void *arg)
{
    struct twin_exec *x = arg;
    for (size_t i = 0; i < x->n; i++) {
        if (x->nodes[i].kind == GN_KERNEL)
            TWIN_COUNT(TWIN_GRAPH_KERNELS);
        else
            run_op(&x->nodes[i].op);
    }
    exec_release(x);
}

API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags)
{
    const unsigned long long known = cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload
                                     | cudaGraphInstantiateFlagDeviceLaunch | cudaGraphInstantiateFlagUseNodePriority;
    struct twin_graph *x = graph_of(g);
    struct twin_exec *ex;
    T();
    if (e == NULL || x == NULL || (flags & ~known) != 0)
        return fail(cudaErrorInvalidValue);
    if ((ex = calloc(1, sizeof(*ex))) == NULL)
        return fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&q_mu);
    if (x->n > 0 && (ex->nodes = calloc(x->n, sizeof(*ex->nodes))) == NULL) {
        pthread_mutex_unlock(&q_mu);
        free(ex);
        return fail(cudaErrorMemoryAllocation);
    }
    for (size_t i = 0; i < x->n; i++) {
        ex->nodes[i] = *x->nodes[i];
        ex->nodes[i].deps = (struct twin_deps){ 0 };
        if (ex->nodes[i].obj != NULL)
            __atomic_add_fetch(&ex->nodes[i].obj->refs, 1, __ATOMIC_ACQ_REL);
    }
    ex->n = x->n;
    pthread_mutex_unlock(&q_mu);
    ex->magic = EXEC_MAGIC;
    ex->refs = 1;
    *e = (cudaGraphExec_t)ex;
    return cudaSuccess;
}

/* CUDA 12+'s cudaGraphInstantiate(exec, graph, flags) is the same call (torch 2.11 uses the WithFlags form). */
API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags)
{
    return cudaGraphInstantiateWithFlags(e, g, flags);
}

/* The exec handle stops being one at once; launches already placed still run (their reference keeps it). */
API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    struct twin_exec *x = exec_of(e);
    if (x == NULL)
        return fail(cudaErrorInvalidValue);
    x->magic = 0;
    exec_release(x);
    return cudaSuccess;
}

API cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
    struct twin_exec *x = exec_of(e);
    struct twin_stream *f;
    struct op *o;
    int capturing;
    cudaError_t rc;
    T();
    if (x == NULL)
        return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&q_mu);
    capturing = (f = resolve_locked(s)) != NULL && f->cap != NULL;
    pthread_mutex_unlock(&q_mu);
    if (capturing)
        return fail(cudaErrorStreamCaptureUnsupported);
    if ((o = new_op(OP_HOST)) == NULL)
        return fail(cudaErrorMemoryAllocation);
    o->u.host.fn = exec_run;
    o->u.host.arg = x;
    __atomic_add_fetch(&x->refs, 1, __ATOMIC_ACQ_REL);
    if ((rc = submit(s, o, 0, 0)) != cudaSuccess) {
        exec_release(x);
        return rc; /* submit kept it as the last error */
    }
    TWIN_COUNT(TWIN_GRAPH_LAUNCHES);
    return cudaSuccess;
}

/* A Graphviz file of the graph: one vertex per node (kernel, memcpy, memset, host, free), one edge per
 * dependency (CUDAGraph::debug_dump calls it with cudaGraphDebugDotFlagsVerbose; the flags are not acted on). */
API cudaError_t cudaGraphDebugDotPrint(cudaGraph_t g, const char *path, unsigned int flags)
{
    static const char *const kinds[] = { "memcpy", "memset", "record", "wait", "host", "callback", "free", "kernel" };
    struct twin_graph *x = graph_of(g);
    FILE *f;
    (void)flags;
    if (x == NULL || path == NULL)
        return fail(cudaErrorInvalidValue);
    if ((f = fopen(path, "w")) == NULL)
        return fail(cudaErrorOperatingSystem);
    pthread_mutex_lock(&q_mu);
    fprintf(f, "digraph twin_graph {\n");
    for (size_t i = 0; i < x->n; i++) {
        const struct twin_gnode *n = x->nodes[i];
        fprintf(f, "  n%zu [label=\"%zu %s\"];\n", i, i, n->kind == GN_KERNEL ? "kernel" : kinds[n->op.kind]);
        for (size_t k = 0; k < n->deps.n; k++)
            fprintf(f, "  n%zu -> n%zu;\n", n->deps.v[k]->index, i);
    }
    fprintf(f, "}\n");
    pthread_mutex_unlock(&q_mu);
    return fclose(f) == 0 ? cudaSuccess : fail(cudaErrorOperatingSystem);
}
