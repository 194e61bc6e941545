/* Records the Python program (python.bpf.c) puts in the ring buffer. Each record struct starts
 * with a u8 type (Python receiver: 112-127), has explicit padding, is zeroed before it is
 * filled, and has exactly one Python mirror in otel_ebpf/receivers/python/receiver.py (checked by
 * tests/unit/test_python_layout.py). Times are bpf_ktime_get_ns() (CLOCK_MONOTONIC).
 */
#ifndef OE_PYTHON_H
#define OE_PYTHON_H

#define PY_EV_CALL 112

#define PY_FILE_LEN 128  /* code.co_filename bytes kept (NUL included); longer ones are cut */
#define PY_FUNC_LEN 64   /* code.co_name bytes kept (NUL included) */

/* One finished Python function call that passed the in-kernel filters. 248 bytes.
 * start_ns doubles as the call's id within its thread (two calls of one thread never enter in
 * the same nanosecond: each entry is a uprobe trap of a microsecond or more). */
struct py_call_rec {
    u8 type;
    u8 _pad[3];
    u32 pid;
    u32 tid;
    u32 depth;          /* frames below it on the thread's stack since the probes attached */
    u64 start_ns;       /* function__entry */
    u64 end_ns;         /* function__return */
    u64 parent_start;   /* start_ns of the nearest enclosing call that passes the path filter; 0: none */
    u64 root_start;     /* start_ns of the outermost such call (itself when it has no parent) */
    s32 line;           /* line number at entry (the def line or the first executed line) */
    u32 _pad2;
    char file[PY_FILE_LEN];
    char func[PY_FUNC_LEN];
};

#endif /* OE_PYTHON_H */
