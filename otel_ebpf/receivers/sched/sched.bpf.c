/* Scheduler accounting of traced processes. Prepended with
 * otel_ebpf/bpf/include/common.bpf.c. Tracepoints only (no kprobes, no task_struct fields).
 *
 * Accounting is done here, in maps, never with a record per context switch:
 * - `threads` (tid -> sched_thread): when the thread went on/off CPU, why it went off, when it
 *   was woken, and its own cumulative times. Created when a traced thread first switches out
 *   (or at its creation, task_newtask), deleted at its last switch-out (state X/Z).
 * - `procs` (tgid -> sched_proc): cumulative on-CPU time, off-CPU time by reason, run-queue
 *   time, voluntary/involuntary switches and a log2 histogram of run-queue waits.
 * - `cpu_time` ((tgid, cpu) -> ns): on-CPU time per core.
 * Python reads and deletes them (receiver.py). Full maps are counted in drops[].
 *
 * sched_switch: prev_state (the kernel's __trace_sched_switch_state, 4.14+) is a bit per
 * reported state: 0x1 S, 0x2 D, 0x4 T, 0x8 t, 0x10 X, 0x20 Z, 0x40 P, 0x80 I, 0x100 preempted;
 * 0 is runnable (sched_yield). Runnable or preempted is an involuntary switch; the wait until
 * the next switch-in is run-queue time. Otherwise the thread blocked (voluntary): the time
 * until sched_wakeup is off-CPU time by reason, from wakeup to switch-in is run-queue time.
 * "lock" is a sleep inside futex() (sys_enter/exit_futex, with SCHED_LOCK=1).
 *
 * No ring-buffer records: fork, exec and exit code are the lifecycle receiver's
 * (otel_ebpf/receivers/lifecycle). task:task_newtask (attached from Python to `sched_newtask`
 * because common.bpf.c owns the TRACEPOINT_PROBE name; the argument offsets come from the
 * tracepoint's format file as -D macros) only creates the new thread's state, so that its first
 * run-queue wait is counted for the right process.
 *
 * Parameters (-D): SCHED_MAX_THREADS, SCHED_MAX_PROCS, SCHED_MAX_CPU_KEYS, SCHED_LOCK,
 * SCHED_NEWTASK_PID_OFF, SCHED_NEWTASK_FLAGS_OFF.
 */
#include "sched.h"

#ifndef SCHED_MAX_THREADS
#define SCHED_MAX_THREADS 65536
#endif
#ifndef SCHED_MAX_PROCS
#define SCHED_MAX_PROCS 8192
#endif
#ifndef SCHED_MAX_CPU_KEYS
#define SCHED_MAX_CPU_KEYS 65536
#endif
#ifndef SCHED_LOCK
#define SCHED_LOCK 1
#endif
#ifndef SCHED_NEWTASK_PID_OFF
#define SCHED_NEWTASK_PID_OFF 8
#endif
#ifndef SCHED_NEWTASK_FLAGS_OFF
#define SCHED_NEWTASK_FLAGS_OFF 32
#endif

struct sched_thread {
    u32 tgid;
    u32 cpu;           /* core it last ran on */
    u64 on_ts;         /* switched in at; 0: not on CPU (or not seen switching in) */
    u64 off_ts;        /* switched out at; 0: on CPU, or never seen */
    u64 wake_ts;       /* woken at, after off_ts; 0: not yet */
    u8 reason;         /* SCHED_R_* at switch-out */
    u8 in_futex;
    u8 _pad[6];
    u64 on_ns;         /* this thread's cumulative times */
    u64 off_ns[SCHED_REASONS];
    u64 runq_ns;
};

struct sched_proc {
    u64 on_ns;
    u64 off_ns[SCHED_REASONS];
    u64 runq_ns;
    u64 voluntary;
    u64 involuntary;
    u64 hist[SCHED_HIST_SLOTS];
};

struct sched_cpu_key {
    u32 tgid;
    u32 cpu;
};

BPF_HASH(threads, u32, struct sched_thread, SCHED_MAX_THREADS);
BPF_HASH(procs, u32, struct sched_proc, SCHED_MAX_PROCS);
BPF_HASH(cpu_time, struct sched_cpu_key, u64, SCHED_MAX_CPU_KEYS);
BPF_ARRAY(proc_zero, struct sched_proc, 1);  /* never written: the initial value of procs */
/* [0]: switch-outs of a thread whose switch-in the program did not see (on_ts 0 while off_ts is set): the kernel
 * traced no sched_switch into it. Seen on this project's CI VMs (a sandbox's 6.18 kernel): the kernel traces no
 * switch out of the threads of the sandbox's own init (pid 1, process_api: its tokio-rt-worker threads appear as
 * next_pid, never as prev_pid), so the thread that runs after one of them is never seen switching in; ftrace's own
 * sched_switch events have the same gaps (session 32: 15 double switch-outs in 4,760 events in 4 s, each after a
 * switch to one of those threads). The program was not skipped (its recursion_misses stayed 0), and a
 * raw-tracepoint form of it missed as many; the count did not grow with ~250k map reads a second either. The time
 * that thread then ran is not counted on-CPU; the receiver exports the count. */
BPF_ARRAY(switch_missed, u64, 1);

static __always_inline struct sched_proc *sched_proc_of(u32 tgid)
{
    struct sched_proc *p = procs.lookup(&tgid);
    if (p)
        return p;
    int zero = 0;
    struct sched_proc *init = proc_zero.lookup(&zero);
    if (!init)
        return NULL;
    p = procs.lookup_or_try_init(&tgid, init);
    if (!p)
        oe_drop(OE_DROP_STATSMAP);
    return p;
}

static __always_inline u8 sched_reason(long state, u8 in_futex)
{
    if (state & 0x2)
        return SCHED_R_IO;
    if (state & (0x1 | 0x80))
        return in_futex ? SCHED_R_LOCK : SCHED_R_SLEEP;
    return SCHED_R_OTHER;
}

static __always_inline void sched_out(u32 tid, u32 tgid, long state, u64 now, u32 cpu)
{
    struct sched_thread *t = threads.lookup(&tid);
    if (!t) {
        struct sched_thread z = {};
        z.tgid = tgid;
        if (threads.update(&tid, &z) != 0) {
            oe_drop(OE_DROP_STATEMAP);
            return;
        }
        t = threads.lookup(&tid);
        if (!t)
            return;
    }
    struct sched_proc *p = sched_proc_of(tgid);
    if (!t->on_ts && t->off_ts) {  /* running, but its switch-in was not seen */
        int zero = 0;
        u64 *m = switch_missed.lookup(&zero);
        if (m)
            __sync_fetch_and_add(m, 1);
    }
    if (t->on_ts && now > t->on_ts) {
        u64 d = now - t->on_ts;
        t->on_ns += d;
        if (p)
            __sync_fetch_and_add(&p->on_ns, d);
        struct sched_cpu_key k = {.tgid = tgid, .cpu = cpu};
        u64 zero = 0;
        u64 *c = cpu_time.lookup_or_try_init(&k, &zero);
        if (c)
            __sync_fetch_and_add(c, d);
        else
            oe_drop(OE_DROP_STATSMAP);
    }
    if (state & (0x10 | 0x20)) {  /* X/Z: the thread's last switch-out */
        threads.delete(&tid);
        return;
    }
    int involuntary = state == 0 || (state & 0x100);
    if (p)
        __sync_fetch_and_add(involuntary ? &p->involuntary : &p->voluntary, 1);
    t->on_ts = 0;
    t->off_ts = now;
    t->wake_ts = involuntary ? now : 0;
    t->reason = involuntary ? SCHED_R_RUNQ : sched_reason(state, t->in_futex);
}

static __always_inline void sched_in(u32 tid, u64 now, u32 cpu)
{
    struct sched_thread *t = threads.lookup(&tid);
    if (!t)
        return;  /* not traced, or not seen since the program loaded */
    u64 off = t->off_ts, wake = t->wake_ts;
    t->on_ts = now;
    t->off_ts = 0;
    t->wake_ts = 0;
    t->cpu = cpu;
    if (!off || now <= off)
        return;
    if (!wake || wake < off || wake > now)
        wake = now;  /* the wakeup was not seen: all of it counts as blocked */
    u64 blocked = wake - off, runq = now - wake;
    u8 r = t->reason;
    struct sched_proc *p = sched_proc_of(t->tgid);
    if (r < SCHED_REASONS) {
        t->off_ns[r] += blocked;
        if (p)
            __sync_fetch_and_add(&p->off_ns[r], blocked);
    }
    if (wake == now && r != SCHED_R_RUNQ)
        return;  /* no run-queue wait measured */
    t->runq_ns += runq;
    if (!p)
        return;
    __sync_fetch_and_add(&p->runq_ns, runq);
    /* BCC's bpf_log2l(v) is floor(log2(v)) + 1 (the bit count, as its print_log2_hist labels
     * slot s [2^(s-1), 2^s)); sched.h's slot i is [2^i, 2^(i+1)): one less. */
    u32 slot = runq ? bpf_log2l(runq) - 1 : 0;
    if (slot >= SCHED_HIST_SLOTS)
        slot = SCHED_HIST_SLOTS - 1;
    __sync_fetch_and_add(&p->hist[slot], 1);
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    u32 cpu = bpf_get_smp_processor_id();
    u32 prev = args->prev_pid, next = args->next_pid;
    if (prev) {
        u32 tgid = bpf_get_current_pid_tgid() >> 32;  /* current is still prev here */
        if (oe_is_traced(tgid))
            sched_out(prev, tgid, args->prev_state, now, cpu);
    }
    if (next)
        sched_in(next, now, cpu);
    return 0;
}

static __always_inline void sched_woken(u32 tid)
{
    struct sched_thread *t = threads.lookup(&tid);
    if (!t)
        return;
    u64 now = bpf_ktime_get_ns();
    if (!t->off_ts && !t->on_ts) {  /* a new thread: runnable from now */
        t->off_ts = now;
        t->wake_ts = now;
        t->reason = SCHED_R_RUNQ;
    } else if (t->off_ts && !t->wake_ts) {
        t->wake_ts = now;
    }
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    sched_woken(args->pid);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
    sched_woken(args->pid);
    return 0;
}

#if SCHED_LOCK
TRACEPOINT_PROBE(syscalls, sys_enter_futex)
{
    u32 tid = bpf_get_current_pid_tgid();
    struct sched_thread *t = threads.lookup(&tid);
    if (t)
        t->in_futex = 1;
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_futex)
{
    u32 tid = bpf_get_current_pid_tgid();
    struct sched_thread *t = threads.lookup(&tid);
    if (t)
        t->in_futex = 0;
    return 0;
}
#endif

/* task:task_newtask, attached from Python (common.bpf.c owns the TRACEPOINT_PROBE name). */
int sched_newtask(void *ctx)
{
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!oe_is_traced(parent))
        return 0;
    u32 child = 0;
    u64 flags = 0;
    bpf_probe_read_kernel(&child, sizeof(child), (char *)ctx + SCHED_NEWTASK_PID_OFF);
    bpf_probe_read_kernel(&flags, sizeof(flags), (char *)ctx + SCHED_NEWTASK_FLAGS_OFF);
    int thread = (flags & 0x00010000) != 0;  /* CLONE_THREAD */
    struct sched_thread z = {};
    z.tgid = thread ? parent : child;
    if (threads.update(&child, &z) != 0)
        oe_drop(OE_DROP_STATEMAP);
    return 0;
}
