/* Python function calls from the interpreter's USDT probes (python:function__entry and
 * python:function__return, present when CPython is built --with-dtrace: Debian, Ubuntu and
 * Fedora builds).
 *
 * - The probes are attached per process (receiver.py, with the kernel's uprobe reference
 *   counter so the interpreter's probe semaphores are raised only in traced processes): no
 *   other Python process on the host traps.
 * - Entry and return are paired here, per thread, on a bounded stack (PY_MAX_DEPTH frames,
 *   a power of two); deeper frames are counted (py_counts[PY_CNT_TOO_DEEP]), not recorded.
 * - Filters run here, so only meaningful calls cross the ring buffer: a call is recorded when
 *   it lasted at least PY_MIN_DURATION_NS and (with PY_NUM_PREFIXES > 0) its file name starts
 *   with one of the prefixes in py_prefixes (checked at entry, so a record can name its
 *   nearest enclosing recorded call: parent_start / root_start).
 * - The USDT argument locations differ between interpreter builds; receiver.py reads them
 *   from the binary's stapsdt notes (via BCC) and passes them as the PY_{ENTRY,RETURN}_
 *   {FILE,FUNC,LINE}(ctx) macros.
 *
 * - Nesting (OE_THREAD_CTX, common.bpf.c): the innermost open call that passes the path filter
 *   is written to the thread's python slot of oe_thread_ctx at its entry and replaced by its
 *   enclosing one at its return, so the cuda program can name it as the parent of a CUDA call.
 *   Its duration is not known then: a CUDA call inside a call shorter than PY_MIN_DURATION_NS
 *   names a parent that is never recorded.
 *
 * Parameters (-D): PY_MAX_DEPTH, PY_MAX_THREADS, PY_MIN_DURATION_NS, PY_NUM_PREFIXES and the
 * argument macros.
 */
#include "python.h"

#ifndef PY_MAX_DEPTH
#define PY_MAX_DEPTH 128
#endif
#ifndef PY_MAX_THREADS
#define PY_MAX_THREADS 16384
#endif
#ifndef PY_MIN_DURATION_NS
#define PY_MIN_DURATION_NS 1000000
#endif
#ifndef PY_NUM_PREFIXES
#define PY_NUM_PREFIXES 0
#endif
#define PY_PREFIX_LEN PY_FILE_LEN /* a prefix is compared with the (cut) file name */

#define PY_CNT_TOO_DEEP 0
#define PY_CNT_UNPAIRED 1
#define PY_CNT_ENTRIES 2  /* entry probe fires: 0 with returns flowing is CPython gh-98894 */
#define PY_CNT_SLOTS 3

struct py_frame {
    u64 start;
    u64 parent;  /* start of the nearest enclosing matched frame; 0: none */
    u64 anc;     /* start of the nearest matched frame at or above this one (itself if matched) */
    u64 root;    /* start of the outermost matched frame on the path; 0: none */
    s32 line;
    u32 matched; /* passes the path-prefix filter */
};

struct py_stack {
    u32 depth;   /* frames entered and not yet returned, including those beyond PY_MAX_DEPTH */
    u32 _pad;
    struct py_frame f[PY_MAX_DEPTH];
};

struct py_prefix {
    u32 len;
    char s[PY_PREFIX_LEN];
};

/* Not preallocated: a stack is PY_MAX_DEPTH * 40 bytes, allocated when a thread first calls. */
BPF_F_TABLE("hash", u32, struct py_stack, py_stacks, PY_MAX_THREADS, BPF_F_NO_PREALLOC);
BPF_ARRAY(py_zero, struct py_stack, 1);          /* never written: the value a new thread starts with */
BPF_ARRAY(py_counts, u64, PY_CNT_SLOTS);
#if PY_NUM_PREFIXES > 0
BPF_ARRAY(py_prefixes, struct py_prefix, PY_NUM_PREFIXES);
struct py_file_buf {
    char s[PY_FILE_LEN];
};
BPF_PERCPU_ARRAY(py_file_scratch, struct py_file_buf, 1);
#endif

static __always_inline void py_count(int idx)
{
    u64 *v = py_counts.lookup(&idx);
    if (v)
        __sync_fetch_and_add(v, 1);
}

/* 1 when the file name at `file` starts with a configured prefix (always 1 without prefixes). */
static __always_inline u32 py_path_matches(u64 file)
{
#if PY_NUM_PREFIXES > 0
    int zero = 0;
    struct py_file_buf *buf = py_file_scratch.lookup(&zero);
    if (!buf)
        return 0;
    if (bpf_probe_read_user_str(buf->s, sizeof(buf->s), (void *)file) <= 0)
        return 0;
    for (int i = 0; i < PY_NUM_PREFIXES; i++) {
        int idx = i;
        struct py_prefix *p = py_prefixes.lookup(&idx);
        if (!p || p->len == 0 || p->len > PY_PREFIX_LEN)
            continue;
        u32 len = p->len;
        /* Hide len's bound from clang: knowing len <= PY_PREFIX_LEN, it would count the loop
         * down from len alone, and the verifier cannot bound that pointer walk. */
        asm volatile("" : "+r"(len));
        int same = 1;
        for (int j = 0; j < PY_PREFIX_LEN; j++) {
            if (j >= len)
                break;
            if (buf->s[j] != p->s[j]) {
                same = 0;
                break;
            }
        }
        if (same)
            return 1;
    }
    return 0;
#else
    return 1;
#endif
}

int py_entry(struct pt_regs *ctx)
{
    py_count(PY_CNT_ENTRIES);
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct py_stack *s = py_stacks.lookup(&tid);
    if (!s) {
        int zero = 0;
        struct py_stack *z = py_zero.lookup(&zero);
        if (!z)
            return 0;
        if (py_stacks.insert(&tid, z) != 0) {
            oe_drop(OE_DROP_STATEMAP);
            return 0;
        }
        s = py_stacks.lookup(&tid);
        if (!s)
            return 0;
    }
    u32 d = s->depth;
    s->depth = d + 1;
    if (d >= PY_MAX_DEPTH) {
        py_count(PY_CNT_TOO_DEEP);
        return 0;
    }
    u64 up_anc = 0, up_root = 0;
    if (d > 0) {
        struct py_frame *up = &s->f[(d - 1) & (PY_MAX_DEPTH - 1)];
        up_anc = up->anc;
        up_root = up->root;
    }
    struct py_frame *f = &s->f[d & (PY_MAX_DEPTH - 1)];
    u64 now = bpf_ktime_get_ns();
    u32 matched = py_path_matches((u64)PY_ENTRY_FILE(ctx));
    f->start = now;
    f->parent = up_anc;
    f->matched = matched;
    f->line = (s32)PY_ENTRY_LINE(ctx);
    if (matched) {
        f->anc = now;
        f->root = up_anc ? up_root : now;
#ifdef OE_THREAD_CTX
        oe_ctx_set(tid, OE_CTX_PYTHON, now, f->root, 0, d);
#endif
    } else {
        f->anc = up_anc;
        f->root = up_root;
    }
    return 0;
}

int py_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct py_stack *s = py_stacks.lookup(&tid);
    if (!s || s->depth == 0) {
        py_count(PY_CNT_UNPAIRED); /* entered before the probes attached */
        return 0;
    }
    u32 d = s->depth - 1;
    s->depth = d;
    if (d >= PY_MAX_DEPTH)
        return 0;
    struct py_frame *f = &s->f[d & (PY_MAX_DEPTH - 1)];
    if (!f->matched)
        return 0;
#ifdef OE_THREAD_CTX
    /* back to the enclosing matched call (same root), or none; its depth is not kept here */
    oe_ctx_set(tid, OE_CTX_PYTHON, f->parent, f->parent ? f->root : 0, 0, 0);
#endif
    u64 now = bpf_ktime_get_ns();
    if (now - f->start < PY_MIN_DURATION_NS)
        return 0;
    struct py_call_rec *e = events.ringbuf_reserve(sizeof(struct py_call_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = PY_EV_CALL;
    e->pid = id >> 32;
    e->tid = tid;
    e->depth = d;
    e->start_ns = f->start;
    e->end_ns = now;
    e->parent_start = f->parent;
    e->root_start = f->root;
    e->line = f->line;
    bpf_probe_read_user_str(e->file, sizeof(e->file), (void *)(u64)PY_RETURN_FILE(ctx));
    bpf_probe_read_user_str(e->func, sizeof(e->func), (void *)(u64)PY_RETURN_FUNC(ctx));
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

/* A thread's stack goes with the thread. Not filtered by `traced` (common.bpf.c may already
 * have removed the process): one hash delete per thread exit. */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    py_stacks.delete(&tid);
#ifdef OE_THREAD_CTX
    oe_ctx_forget(tid);
#endif
    return 0;
}
