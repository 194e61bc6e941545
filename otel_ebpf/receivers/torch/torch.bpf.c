/* PyTorch operators: uprobe + uretprobe on the dispatcher entry points
 * at::_ops::<op>::call in libtorch_cpu.so (every call of an ATen operator from Python, from
 * C++ and from autograd's backward goes through them).
 *
 * - One BPF function serves every operator: the entry address (PT_REGS_IP at the uprobe) says
 *   which one, and receiver.py maps it back to the symbol.
 * - Entry and return are paired here per thread on a bounded stack (TORCH_MAX_DEPTH, a power
 *   of two; operators call operators: linear -> addmm). Deeper calls are counted
 *   (torch_counts[TORCH_CNT_TOO_DEEP]). Calls shorter than TORCH_MIN_DURATION_NS are not
 *   recorded. Each record names its enclosing operator (parent_start) and the outermost one
 *   (root_start), so spans nest without buffering.
 *
 * - Nesting (OE_THREAD_CTX, common.bpf.c): the innermost open operator call (start, root,
 *   entry address, depth) is written to the thread's torch slot of oe_thread_ctx at entry and
 *   replaced by the enclosing one at return, for the cuda program (CUDA calls and launch
 *   counters name the operator that issued them). Calls beyond TORCH_MAX_DEPTH are not written.
 *
 * Parameters (-D): TORCH_MAX_DEPTH, TORCH_MAX_THREADS, TORCH_MIN_DURATION_NS.
 */
#include "torch.h"

#ifndef TORCH_MAX_DEPTH
#define TORCH_MAX_DEPTH 16
#endif
#ifndef TORCH_MAX_THREADS
#define TORCH_MAX_THREADS 4096
#endif
#ifndef TORCH_MIN_DURATION_NS
#define TORCH_MIN_DURATION_NS 0
#endif

#define TORCH_CNT_TOO_DEEP 0
#define TORCH_CNT_UNPAIRED 1
#define TORCH_CNT_SLOTS 2

struct torch_frame {
    u64 start;
    u64 ip;
};

struct torch_stack {
    u32 depth;   /* calls entered and not yet returned, including those beyond TORCH_MAX_DEPTH */
    u32 _pad;
    struct torch_frame f[TORCH_MAX_DEPTH];
};

BPF_HASH(torch_stacks, u32, struct torch_stack, TORCH_MAX_THREADS);
BPF_ARRAY(torch_zero, struct torch_stack, 1);   /* never written: a new thread's stack */
BPF_ARRAY(torch_counts, u64, TORCH_CNT_SLOTS);

static __always_inline void torch_count(int idx)
{
    u64 *v = torch_counts.lookup(&idx);
    if (v)
        __sync_fetch_and_add(v, 1);
}

int torch_op_enter(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    u32 tid = (u32)id;
    struct torch_stack *s = torch_stacks.lookup(&tid);
    if (!s) {
        int zero = 0;
        struct torch_stack *z = torch_zero.lookup(&zero);
        if (!z)
            return 0;
        if (torch_stacks.insert(&tid, z) != 0) {
            oe_drop(OE_DROP_STATEMAP);
            return 0;
        }
        s = torch_stacks.lookup(&tid);
        if (!s)
            return 0;
    }
    u32 d = s->depth;
    s->depth = d + 1;
    if (d >= TORCH_MAX_DEPTH) {
        torch_count(TORCH_CNT_TOO_DEEP);
        return 0;
    }
    struct torch_frame *f = &s->f[d & (TORCH_MAX_DEPTH - 1)];
    f->start = bpf_ktime_get_ns();
    f->ip = PT_REGS_IP(ctx);
#ifdef OE_THREAD_CTX
    oe_ctx_set(tid, OE_CTX_TORCH, f->start, d ? s->f[0].start : f->start, f->ip, d);
#endif
    return 0;
}

int torch_op_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct torch_stack *s = torch_stacks.lookup(&tid);
    if (!s || s->depth == 0) {
        if (oe_is_traced(id >> 32))
            torch_count(TORCH_CNT_UNPAIRED); /* entered before the probes attached */
        return 0;
    }
    u32 d = s->depth - 1;
    s->depth = d;
    if (d >= TORCH_MAX_DEPTH)
        return 0;
    struct torch_frame *f = &s->f[d & (TORCH_MAX_DEPTH - 1)];
#ifdef OE_THREAD_CTX
    if (d > 0) {
        u32 ui = d - 1;
        /* mask after the barrier: clang would otherwise fold it into the index arithmetic
         * shared with the record below, and the verifier sees an unbounded access */
        asm volatile("" : "+r"(ui));
        ui &= TORCH_MAX_DEPTH - 1;
        struct torch_frame *up = &s->f[ui];
        oe_ctx_set(tid, OE_CTX_TORCH, up->start, s->f[0].start, up->ip, d - 1);
    } else {
        oe_ctx_set(tid, OE_CTX_TORCH, 0, 0, 0, 0);
    }
#endif
    u64 now = bpf_ktime_get_ns();
    if (now - f->start < TORCH_MIN_DURATION_NS)
        return 0;
    struct torch_op_rec *e = events.ringbuf_reserve(sizeof(struct torch_op_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = TORCH_EV_OP;
    e->pid = id >> 32;
    e->tid = tid;
    e->depth = d;
    e->start_ns = f->start;
    e->end_ns = now;
    e->ip = f->ip;
    if (d > 0) {
        e->parent_start = s->f[(d - 1) & (TORCH_MAX_DEPTH - 1)].start;
        e->root_start = s->f[0].start;
    } else {
        e->root_start = f->start;
    }
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

/* A thread's stack goes with the thread (not filtered by `traced`, see cuda.bpf.c). */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    torch_stacks.delete(&tid);
#ifdef OE_THREAD_CTX
    oe_ctx_forget(tid);
#endif
    return 0;
}
