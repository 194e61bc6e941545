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
 * - What encloses a top-level call (depth 0), decided at its entry, so the call, the calls
 *   under it and the CUDA calls under those (through oe_thread_ctx) share one root:
 *   * a traced Python call open on the thread (the python program's slot of oe_thread_ctx):
 *     root = that call's root | TORCH_ROOT_PYTHON, parent = that call;
 *   * otherwise (TORCH_STEPS) the thread's open step: root = step start | TORCH_ROOT_STEP,
 *     parent = the step. A step begins at the first top-level call after the last one ended;
 *     it ends at a step marker (record_function scopes: an Optimizer.step#... scope's exit, a
 *     ProfilerStep#... scope's entry), at thread exit, or by the rule of torch_steps.h (a gap
 *     on a thread without markers; open too long; too many calls). Its end is one
 *     torch_step_rec (the processor's pytorch.step span).
 *   * otherwise root = its own start (one trace per top-level call).
 * - Markers: uprobes on torch::autograd::profiler::record_function_enter_new (the name: the
 *   std::string& after the return slot; its uretprobe reads the PythonRecordFunction* it made)
 *   and record_function_exit_new (that pointer again): torch/csrc/autograd/record_function_ops.cpp.
 *   Only the outermost Optimizer.step# scope of a thread counts (an optimizer wrapping another).
 *
 * - Nesting (OE_THREAD_CTX, common.bpf.c): the innermost open operator call (start, root,
 *   entry address, depth) is written to the thread's torch slot of oe_thread_ctx at entry and
 *   replaced by the enclosing one at return, for the cuda program (CUDA calls and launch
 *   counters name the operator that issued them). Calls beyond TORCH_MAX_DEPTH are not written.
 *
 * Parameters (-D): TORCH_MAX_DEPTH, TORCH_MAX_THREADS, TORCH_MIN_DURATION_NS, TORCH_STEPS,
 * TORCH_STEP_GAP_NS, TORCH_STEP_MAX_NS, TORCH_STEP_MAX_OPS.
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
#ifndef TORCH_STEPS
#define TORCH_STEPS 1
#endif
#ifndef TORCH_STEP_GAP_NS
#define TORCH_STEP_GAP_NS 10000000ULL
#endif
#ifndef TORCH_STEP_MAX_NS
#define TORCH_STEP_MAX_NS 10000000000ULL
#endif
#ifndef TORCH_STEP_MAX_OPS
#define TORCH_STEP_MAX_OPS 10000
#endif

/* the std::string& name of record_function_enter_new, and where its intrusive_ptr result goes
 * (returned in memory: it has a non-trivial destructor; SysV x86-64 passes that address in rdi,
 * AAPCS64 in x8) */
#if defined(__TARGET_ARCH_arm64)
#define TORCH_RF_NAME(ctx) PT_REGS_PARM1(ctx)
#define TORCH_RF_SLOT(ctx) ((ctx)->regs[8])
#else
#define TORCH_RF_NAME(ctx) PT_REGS_PARM2(ctx)
#define TORCH_RF_SLOT(ctx) PT_REGS_PARM1(ctx)
#endif

#include "torch_steps.h"

#define TORCH_CNT_TOO_DEEP 0
#define TORCH_CNT_UNPAIRED 1
#define TORCH_CNT_SLOTS 2

struct torch_frame {
    u64 start;
    u64 ip;
};

struct torch_stack {
    u32 depth;      /* calls entered and not yet returned, including those beyond TORCH_MAX_DEPTH */
    u32 _pad;
    u64 root;       /* root_start of the open top-level call and every call under it */
    u64 parent0;    /* parent_start of the open top-level call */
    u64 rf_slot;    /* record_function_enter_new's result slot while an outermost Optimizer.step# enters */
    u64 opt_scope;  /* the open outermost Optimizer.step# scope (PythonRecordFunction*); 0: none */
    struct torch_step_state step;
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

static __always_inline struct torch_stack *torch_stack_of(u32 tid)
{
    struct torch_stack *s = torch_stacks.lookup(&tid);
    if (s)
        return s;
    int zero = 0;
    struct torch_stack *z = torch_zero.lookup(&zero);
    if (!z)
        return 0;
    if (torch_stacks.insert(&tid, z) != 0) {
        oe_drop(OE_DROP_STATEMAP);
        return 0;
    }
    return torch_stacks.lookup(&tid);
}

/* End the thread's open step (if any) with one record. */
static __always_inline void torch_step_end(struct torch_stack *s, u32 pid, u32 tid, u8 reason, u64 end)
{
    if (!s->step.start)
        return;
    struct torch_step_rec *e = events.ringbuf_reserve(sizeof(struct torch_step_rec));
    if (e) {
        __builtin_memset(e, 0, sizeof(*e));
        e->type = TORCH_EV_STEP;
        e->reason = reason;
        e->pid = pid;
        e->tid = tid;
        e->ops = s->step.ops;
        e->start_ns = s->step.start;
        e->end_ns = end;
        e->seq = s->step.seq;
        events.ringbuf_submit(e, oe_wakeup_flags());
    } else {
        oe_drop(OE_DROP_RINGBUF);
    }
    s->step.start = 0;
}

/* The root and parent of a top-level call entered at `now` (see the header comment). */
static __always_inline void torch_top_level(struct torch_stack *s, u32 pid, u32 tid, u64 now)
{
    u64 py = 0, py_root = 0;
#ifdef OE_THREAD_CTX
    struct oe_thread_ctx *c = oe_thread_ctx.lookup(&tid);
    if (c) {
        py = c->k[OE_CTX_PYTHON - 1].start;
        py_root = c->k[OE_CTX_PYTHON - 1].root;
    }
#endif
    if (py) {
        s->root = py_root | TORCH_ROOT_PYTHON;
        s->parent0 = py;
        return;
    }
    if (!TORCH_STEPS) {
        s->root = now;
        s->parent0 = 0;
        return;
    }
    u8 reason = torch_step_due(&s->step, now);
    if (reason)
        torch_step_end(s, pid, tid, reason, s->step.last);
    torch_step_add(&s->step, now);
    s->root = s->step.start | TORCH_ROOT_STEP;
    s->parent0 = s->step.start;
}

int torch_op_enter(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    u32 tid = (u32)id;
    struct torch_stack *s = torch_stack_of(tid);
    if (!s)
        return 0;
    u32 d = s->depth;
    s->depth = d + 1;
    if (d >= TORCH_MAX_DEPTH) {
        torch_count(TORCH_CNT_TOO_DEEP);
        return 0;
    }
    struct torch_frame *f = &s->f[d & (TORCH_MAX_DEPTH - 1)];
    f->start = bpf_ktime_get_ns();
    f->ip = PT_REGS_IP(ctx);
    if (d == 0)
        torch_top_level(s, id >> 32, tid, f->start);
#ifdef OE_THREAD_CTX
    oe_ctx_set(tid, OE_CTX_TORCH, f->start, s->root, f->ip, d);
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
        oe_ctx_set(tid, OE_CTX_TORCH, up->start, s->root, up->ip, d - 1);
    } else {
        oe_ctx_set(tid, OE_CTX_TORCH, 0, 0, 0, 0);
    }
#endif
    u64 now = bpf_ktime_get_ns();
    if (d == 0 && (s->root & TORCH_ROOT_STEP))
        s->step.last = now;
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
    e->root_start = s->root;
    if (d > 0)
        e->parent_start = s->f[(d - 1) & (TORCH_MAX_DEPTH - 1)].start;
    else
        e->parent_start = s->parent0;
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

/* ---- step markers (record_function scopes) ---------------------------------------------- */

int torch_rf_enter(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!TORCH_STEPS || !oe_is_traced(id >> 32))
        return 0;
    u64 str = TORCH_RF_NAME(ctx);
    u64 w[2] = {};
    u64 chars = 0, len = 0;
    if (bpf_probe_read_user(&chars, sizeof(chars), (void *)str) != 0 ||
        bpf_probe_read_user(&len, sizeof(len), (void *)(str + 8)) != 0 || len < 13)
        return 0;
    /* libstdc++'s std::string starts with its data pointer (both ABIs), its length next (C++11
     * ABI); 16 bytes fit in any string of 13 or more chars (the SSO buffer is 16 bytes) */
    if (bpf_probe_read_user(w, sizeof(w), (void *)chars) != 0)
        return 0;
    u32 tid = (u32)id;
    int opt = w[0] == TORCH_MARK_OPT_W0 && (w[1] & TORCH_MARK_OPT_M1) == TORCH_MARK_OPT_W1;
    int prof = w[0] == TORCH_MARK_PROF_W0 && (w[1] & TORCH_MARK_PROF_M1) == TORCH_MARK_PROF_W1;
    if (!opt && !prof)
        return 0;
    struct torch_stack *s = torch_stack_of(tid);
    if (!s)
        return 0;
    s->step.marked = 1;
    if (prof)
        torch_step_end(s, id >> 32, tid, TORCH_STEP_END_PROFILER, s->step.last);
    else if (!s->opt_scope)
        s->rf_slot = TORCH_RF_SLOT(ctx);
    return 0;
}

int torch_rf_entered(struct pt_regs *ctx)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct torch_stack *s = torch_stacks.lookup(&tid);
    if (!s || !s->rf_slot)
        return 0;
    u64 scope = 0;
    bpf_probe_read_user(&scope, sizeof(scope), (void *)s->rf_slot);
    s->rf_slot = 0;
    s->opt_scope = scope;
    return 0;
}

int torch_rf_exit(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct torch_stack *s = torch_stacks.lookup(&tid);
    if (!s || !s->opt_scope)
        return 0;
    u64 scope = 0;
    if (bpf_probe_read_user(&scope, sizeof(scope), (void *)PT_REGS_PARM1(ctx)) != 0 || scope != s->opt_scope)
        return 0;
    s->opt_scope = 0;
    torch_step_end(s, id >> 32, tid, TORCH_STEP_END_OPTIMIZER, bpf_ktime_get_ns());
    return 0;
}

/* A thread's stack goes with the thread (not filtered by `traced`, see cuda.bpf.c); its open
 * step ends here. */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct torch_stack *s = torch_stacks.lookup(&tid);
    if (s) {
        u64 end = s->step.last;
        torch_step_end(s, id >> 32, tid, TORCH_STEP_END_THREAD_EXIT, end);
        torch_stacks.delete(&tid);
    }
#ifdef OE_THREAD_CTX
    oe_ctx_forget(tid);
#endif
    return 0;
}
