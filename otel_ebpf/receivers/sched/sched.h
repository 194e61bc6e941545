/* Constants of the scheduler program (sched.bpf.c). It puts no records in the ring buffer: the
 * per-thread and per-process accounting lives in maps (see sched.bpf.c), whose value structs are
 * read through BCC's generated ctypes, so they need no mirror. (Its fork/exec/exit-code records,
 * types 48..50, moved to the lifecycle receiver, otel_ebpf/receivers/lifecycle/lifecycle.h.)
 * The constants Python repeats are checked by tests/unit/receivers/test_sched_layout.py.
 */
#ifndef OE_SCHED_H
#define OE_SCHED_H

/* Off-CPU reasons: the index into off_ns[]. RUNQ is not one of them: time spent runnable
 * (after a wakeup or a preemption) is runq_ns. */
#define SCHED_R_SLEEP 0   /* TASK_INTERRUPTIBLE (S) or TASK_IDLE (I), not in futex() */
#define SCHED_R_IO 1      /* TASK_UNINTERRUPTIBLE (D): disk or other uninterruptible wait */
#define SCHED_R_LOCK 2    /* TASK_INTERRUPTIBLE inside futex(): a userspace lock or condition */
#define SCHED_R_OTHER 3   /* stopped, traced, ... */
#define SCHED_REASONS 4
#define SCHED_R_RUNQ 4    /* thread state only: preempted or new, runnable since off_ts */

#define SCHED_HIST_SLOTS 40  /* log2(ns) buckets: slot i counts waits in [2^i, 2^(i+1)) ns */

#endif /* OE_SCHED_H */
