#ifndef OE_TORCH_H
#define OE_TORCH_H

#define TORCH_EV_OP 128
#define TORCH_EV_STEP 129

/* Tags on root_start (and on the torch slot's root in oe_thread_ctx, which the cuda program
 * copies): what the outermost enclosing span is. Kernel and epoch nanoseconds stay below
 * 1 << 62 (epoch until 2116), and the receivers' clock conversion adds an offset, so a tag
 * survives it. otel_ebpf/core/ids.py (TORCH_ROOT_PYTHON, TORCH_ROOT_STEP) derives ids from them.
 * Untagged: the outermost probed operator call (one trace per top-level call). */
#define TORCH_ROOT_PYTHON (1ULL << 63) /* a traced Python call: the python receiver's root_start */
#define TORCH_ROOT_STEP (1ULL << 62)   /* a step of the thread: its start_ns (struct torch_step_rec) */

/* Why a step ended (torch_step_rec.reason) */
#define TORCH_STEP_END_OPTIMIZER 1   /* its Optimizer.step#... record_function scope exited */
#define TORCH_STEP_END_PROFILER 2    /* a ProfilerStep#... scope began (torch.profiler's step()) */
#define TORCH_STEP_END_GAP 3         /* the next top-level call came after TORCH_STEP_GAP_NS idle */
#define TORCH_STEP_END_MAX_DURATION 4 /* open longer than TORCH_STEP_MAX_NS */
#define TORCH_STEP_END_MAX_OPS 5     /* TORCH_STEP_MAX_OPS top-level calls */
#define TORCH_STEP_END_THREAD_EXIT 6 /* the thread exited */

/* Step markers: the first bytes of PyTorch's record_function names, little-endian words
 * (torch/optim/optimizer.py profile_hook_step: "Optimizer.step#<cls>.step"; torch/profiler/
 * profiler.py step(): "ProfilerStep#<n>"). The second word is compared under its mask. */
#define TORCH_MARK_OPT_W0 0x657a696d6974704fULL   /* "Optimize" */
#define TORCH_MARK_OPT_W1 0x0023706574732e72ULL   /* "r.step#" */
#define TORCH_MARK_OPT_M1 0x00ffffffffffffffULL
#define TORCH_MARK_PROF_W0 0x72656c69666f7250ULL  /* "Profiler" */
#define TORCH_MARK_PROF_W1 0x0000002370657453ULL  /* "Step#" */
#define TORCH_MARK_PROF_M1 0x000000ffffffffffULL

/* One finished operator call (at::_ops::<op>::call). 56 bytes. The operator is identified by
 * the address its uprobe fired at (`ip`, in the process's address space): receiver.py maps it
 * back to the symbol through /proc/PID/maps. start_ns is the call's id within its thread. */
struct torch_op_rec {
    u8 type;
    u8 _pad[3];
    u32 pid;
    u32 tid;
    u32 depth;          /* probed operators below it on the thread's stack */
    u64 start_ns;
    u64 end_ns;
    u64 parent_start;   /* depth > 0: start_ns of the enclosing probed operator; depth 0: start of
                           the innermost traced Python call (root tagged PYTHON), the step's start
                           (root tagged STEP), or 0 */
    u64 root_start;     /* start_ns of the outermost enclosing probed operator (itself at depth 0),
                           or a tagged Python call / step start (TORCH_ROOT_*) */
    u64 ip;             /* entry address of the operator's call() */
};

/* One step of a thread ended: the top-level operator calls made outside traced Python calls
 * between two step boundaries. 40 bytes. */
struct torch_step_rec {
    u8 type;
    u8 reason;          /* TORCH_STEP_END_* */
    u8 _pad[2];
    u32 pid;
    u32 tid;
    u32 ops;            /* top-level operator calls in it */
    u64 start_ns;       /* entry of its first top-level call: the step's id within its thread */
    u64 end_ns;         /* return of its last top-level call (an Optimizer.step exit: that exit) */
    u64 seq;            /* steps begun on this thread since its first probed call, from 1 */
};

#endif /* OE_TORCH_H */
