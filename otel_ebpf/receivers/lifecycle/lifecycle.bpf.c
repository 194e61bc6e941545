/* Process lifecycle of traced processes: fork, exec with argv, exit_group's code. Prepended with
 * otel_ebpf/bpf/include/common.bpf.c. Tracepoints only (no kprobes, no task_struct fields).
 * Every probe here runs once per fork, exec or exit of a process, never per context switch:
 * this is the part of the old sched receiver that is cheap enough to be on by default.
 *
 * - fork: task:task_newtask of a traced parent, attached from Python to `lc_newtask` because
 *   common.bpf.c owns the TRACEPOINT_PROBE name; the argument offsets come from the tracepoint's
 *   format file as -D macros. New threads (CLONE_THREAD) are not reported.
 * - exec: argv is read at sys_enter_execve / sys_enter_execveat from the caller's memory (a
 *   process that lives a millisecond keeps its command line) and kept per thread in
 *   exec_pending; the record is emitted at sys_exit_execve(at) only when the exec succeeded (a
 *   shell trying each PATH entry, or a path that does not exist, is no exec).
 * - exit code: sys_enter_exit_group. The exit itself is common.bpf.c's.
 *
 * Parameters (-D): LC_NEWTASK_PID_OFF, LC_NEWTASK_FLAGS_OFF, LC_EXEC_PENDING.
 */
#include "lifecycle.h"

#ifndef LC_NEWTASK_PID_OFF
#define LC_NEWTASK_PID_OFF 8
#endif
#ifndef LC_NEWTASK_FLAGS_OFF
#define LC_NEWTASK_FLAGS_OFF 32
#endif
#ifndef LC_EXEC_PENDING
#define LC_EXEC_PENDING 1024
#endif

/* execve arguments between sys_enter and sys_exit (LRU: an exec that never returns to the
 * same tid, e.g. from a non-leader thread, ages out) and a per-CPU scratch to build them. */
BPF_TABLE("lru_hash", u32, struct lc_exec_rec, exec_pending, LC_EXEC_PENDING);
BPF_PERCPU_ARRAY(exec_scratch, struct lc_exec_rec, 1);
BPF_ARRAY(exec_zero, struct lc_exec_rec, 1);  /* never written: clears the scratch (too big to memset) */

/* task:task_newtask, attached from Python (common.bpf.c owns the TRACEPOINT_PROBE name). */
int lc_newtask(void *ctx)
{
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!oe_is_traced(parent))
        return 0;
    u32 child = 0;
    u64 flags = 0;
    bpf_probe_read_kernel(&child, sizeof(child), (char *)ctx + LC_NEWTASK_PID_OFF);
    bpf_probe_read_kernel(&flags, sizeof(flags), (char *)ctx + LC_NEWTASK_FLAGS_OFF);
    if (flags & 0x00010000)  /* CLONE_THREAD: a thread of the same process */
        return 0;
    struct lc_fork_rec *e = events.ringbuf_reserve(sizeof(struct lc_fork_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = LC_EV_FORK;
    e->pid = child;
    e->ppid = parent;
    e->ts = bpf_ktime_get_ns();
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

/* sys_enter_execve / sys_enter_execveat: the file and argv, kept until the syscall returns. */
static __always_inline int lc_exec_enter(const char *filename, const char *const *argv)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = id;
    if (!oe_is_traced(tgid))
        return 0;
    int zero = 0;
    struct lc_exec_rec *e = exec_scratch.lookup(&zero);
    struct lc_exec_rec *clear = exec_zero.lookup(&zero);
    if (!e || !clear)
        return 0;
    bpf_probe_read_kernel(e, sizeof(*e), clear);
    e->type = LC_EV_EXEC;
    e->pid = tgid;
    e->tid = tid;
    bpf_probe_read_user_str(e->filename, sizeof(e->filename), filename);
    u32 off = 0;
    u16 argc = 0;
/* a loop, not unrolled: unrolled (24 steps, in both the execve and the execveat program) it cost ~0.08 s more
 * compile at every agent start, which a deferred start waits for (issue 18) */
#pragma clang loop unroll(disable)
    for (int i = 0; i < LC_MAX_ARGS; i++) {
        const char *arg = NULL;
        if (bpf_probe_read_user(&arg, sizeof(arg), &argv[i]) != 0 || !arg)
            goto done;
        if (off >= LC_ARGS_LEN) {
            e->truncated = 1;
            goto done;
        }
        long n = bpf_probe_read_user_str(&e->args[off & (LC_ARGS_LEN - 1)], LC_ARG_MAX, arg);
        if (n <= 0)
            goto done;
        if (n == LC_ARG_MAX)
            e->truncated = 1;
        off += n;
        argc++;
    }
    {
        const char *more = NULL;  /* more arguments than LC_MAX_ARGS? */
        if (bpf_probe_read_user(&more, sizeof(more), &argv[LC_MAX_ARGS]) == 0 && more)
            e->truncated = 1;
    }
done:
    if (off > LC_ARGS_LEN)  /* the last argument read ran past what is kept: it is cut */
        e->truncated = 1;
    e->argc = argc;
    e->args_len = off > LC_ARGS_LEN ? LC_ARGS_LEN : off;
    exec_pending.update(&tid, e);
    return 0;
}

/* sys_exit_execve / sys_exit_execveat: the record, only for an exec that succeeded. */
static __always_inline int lc_exec_exit(long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = id;
    struct lc_exec_rec *pending = exec_pending.lookup(&tid);
    if (!pending) {
        /* a traced exec whose arguments were pushed out of the LRU (or that came from a
         * non-leader thread, whose tid the exec changed): lost, and counted */
        if (ret == 0 && oe_is_traced(id >> 32))
            oe_drop(OE_DROP_STATEMAP);
        return 0;
    }
    if (ret != 0) {  /* failed (ENOENT, EACCES, ...): not an exec */
        exec_pending.delete(&tid);
        return 0;
    }
    struct lc_exec_rec *e = events.ringbuf_reserve(sizeof(struct lc_exec_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        exec_pending.delete(&tid);
        return 0;
    }
    bpf_probe_read_kernel(e, sizeof(*e), pending);
    e->ts = bpf_ktime_get_ns();
    events.ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
    exec_pending.delete(&tid);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_execve)
{
    return lc_exec_enter(args->filename, args->argv);
}

TRACEPOINT_PROBE(syscalls, sys_exit_execve)
{
    return lc_exec_exit(args->ret);
}

TRACEPOINT_PROBE(syscalls, sys_enter_execveat)
{
    return lc_exec_enter(args->filename, args->argv);
}

TRACEPOINT_PROBE(syscalls, sys_exit_execveat)
{
    return lc_exec_exit(args->ret);
}

TRACEPOINT_PROBE(syscalls, sys_enter_exit_group)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!oe_is_traced(tgid))
        return 0;
    struct lc_exit_code_rec *e = events.ringbuf_reserve(sizeof(struct lc_exit_code_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = LC_EV_EXIT_CODE;
    e->pid = tgid;
    e->code = args->error_code & 0xff;  /* the status the parent sees */
    e->ts = bpf_ktime_get_ns();
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}
