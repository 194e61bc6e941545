/* Records the PyTorch program (torch.bpf.c) puts in the ring buffer. Each record struct starts
 * with a u8 type (PyTorch receiver: 128-143), has explicit padding, is zeroed before it is
 * filled, and has exactly one Python mirror in otel_ebpf/receivers/torch/receiver.py (checked by
 * tests/unit/test_torch_layout.py). Times are bpf_ktime_get_ns() (CLOCK_MONOTONIC).
 */
#ifndef OE_TORCH_H
#define OE_TORCH_H

#define TORCH_EV_OP 128

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
    u64 parent_start;   /* start_ns of the enclosing probed operator; 0: none */
    u64 root_start;     /* start_ns of the outermost enclosing probed operator (itself at depth 0) */
    u64 ip;             /* entry address of the operator's call() */
};

#endif /* OE_TORCH_H */
