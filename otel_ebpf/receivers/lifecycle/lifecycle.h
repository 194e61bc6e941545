/* Records the lifecycle program (lifecycle.bpf.c) puts in the ring buffer. Each record struct
 * starts with a u8 type (48..63 belong to this receiver: the sched receiver's lifecycle records
 * until the split; sched has no records now), has explicit padding, is zeroed before it is
 * filled, and has exactly one Python mirror in otel_ebpf/receivers/lifecycle/receiver.py
 * (checked by tests/unit/receivers/test_lifecycle_layout.py). Times are bpf_ktime_get_ns().
 */
#ifndef OE_LIFECYCLE_H
#define OE_LIFECYCLE_H

#define LC_EV_FORK 48
#define LC_EV_EXEC 49
#define LC_EV_EXIT_CODE 50

#define LC_ARGS_LEN 1024     /* bytes of NUL-separated argv kept */
#define LC_ARG_MAX 256       /* longest single argument read */
#define LC_MAX_ARGS 24
#define LC_FILENAME_LEN 256

/* A traced process created a process (not a thread). 32 bytes. */
struct lc_fork_rec {
    u8 type;
    u8 _pad[3];
    u32 pid;           /* the child (a new thread-group id) */
    u32 ppid;          /* the parent's thread-group id */
    u32 _pad2;
    u64 ts;
    char comm[16];     /* the parent's comm, which the child inherits until exec */
};

/* A traced process's successful execve/execveat: file and argv as the caller passed them. */
struct lc_exec_rec {
    u8 type;
    u8 truncated;      /* 1: more arguments (or longer ones) than kept */
    u16 argc;          /* arguments kept */
    u32 pid;
    u32 tid;
    u32 args_len;      /* bytes of args used (NUL-separated) */
    u64 ts;            /* sys_exit_execve(at), the new program's first moment */
    char filename[LC_FILENAME_LEN];  /* execveat: relative to its dirfd (or empty with AT_EMPTY_PATH) */
    char args[LC_ARGS_LEN + LC_ARG_MAX];
};

/* exit_group(code) of a traced process (a process killed by a signal has none). 24 bytes. */
struct lc_exit_code_rec {
    u8 type;
    u8 _pad[3];
    u32 pid;
    s32 code;
    u32 _pad2;
    u64 ts;
};

#endif /* OE_LIFECYCLE_H */
