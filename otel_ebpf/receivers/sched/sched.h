/* Records the scheduler program (sched.bpf.c) puts in the ring buffer. Each record struct
 * starts with a u8 type (48..63 belong to this receiver), has explicit padding, is zeroed
 * before it is filled, and has exactly one Python mirror in otel_ebpf/receivers/sched/receiver.py
 * (checked by tests/unit/test_sched_layout.py). Times are bpf_ktime_get_ns().
 *
 * The per-thread and per-process accounting lives in maps (see sched.bpf.c); their value
 * structs are read through BCC's generated ctypes, so they need no mirror.
 */
#ifndef OE_SCHED_H
#define OE_SCHED_H

#define SCHED_EV_FORK 48
#define SCHED_EV_EXEC 49
#define SCHED_EV_EXIT_CODE 50

/* Off-CPU reasons: the index into off_ns[]. RUNQ is not one of them: time spent runnable
 * (after a wakeup or a preemption) is runq_ns. */
#define SCHED_R_SLEEP 0   /* TASK_INTERRUPTIBLE (S) or TASK_IDLE (I), not in futex() */
#define SCHED_R_IO 1      /* TASK_UNINTERRUPTIBLE (D): disk or other uninterruptible wait */
#define SCHED_R_LOCK 2    /* TASK_INTERRUPTIBLE inside futex(): a userspace lock or condition */
#define SCHED_R_OTHER 3   /* stopped, traced, ... */
#define SCHED_REASONS 4
#define SCHED_R_RUNQ 4    /* thread state only: preempted or new, runnable since off_ts */

#define SCHED_HIST_SLOTS 40  /* log2(ns) buckets: slot i counts waits in [2^i, 2^(i+1)) ns */
#define SCHED_ARGS_LEN 1024  /* bytes of NUL-separated argv kept */
#define SCHED_ARG_MAX 256    /* longest single argument read */
#define SCHED_MAX_ARGS 24
#define SCHED_FILENAME_LEN 256

/* A traced process created a process (not a thread). 32 bytes. */
struct sched_fork_rec {
    u8 type;
    u8 _pad[3];
    u32 pid;           /* the child (a new thread-group id) */
    u32 ppid;          /* the parent's thread-group id */
    u32 _pad2;
    u64 ts;
    char comm[16];     /* the parent's comm, which the child inherits until exec */
};

/* A traced process's successful execve: file and argv as the caller passed them. */
struct sched_exec_rec {
    u8 type;
    u8 truncated;      /* 1: more arguments (or longer ones) than kept */
    u16 argc;          /* arguments kept */
    u32 pid;
    u32 tid;
    u32 args_len;      /* bytes of args used (NUL-separated) */
    u64 ts;            /* sys_exit_execve, the new program's first moment */
    char filename[SCHED_FILENAME_LEN];
    char args[SCHED_ARGS_LEN + SCHED_ARG_MAX];
};

/* exit_group(code) of a traced process (a process killed by a signal has none). 24 bytes. */
struct sched_exit_code_rec {
    u8 type;
    u8 _pad[3];
    u32 pid;
    s32 code;
    u32 _pad2;
    u64 ts;
};

#endif /* OE_SCHED_H */
