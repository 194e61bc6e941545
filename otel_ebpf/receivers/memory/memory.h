/* Records and maps of the memory program (memory.bpf.c). The one ring-buffer record (an OOM
 * kill) starts with a u8 type in this receiver's range 80-95, is zeroed before it is filled,
 * and has exactly one Python mirror in otel_ebpf/receivers/memory/receiver.py (checked against gcc by
 * tests/unit/test_memory_layout.py).
 */
#ifndef OE_MEMORY_H
#define OE_MEMORY_H

#define MM_EV_OOM_KILL 80

/* oom:mark_victim: the kernel chose this process to kill. Sizes in kB, as the tracepoint
 * gives them (0 on kernels whose tracepoint has only the pid). 72 bytes. */
struct mm_oom_rec {
    u8 type;
    u8 _pad[3];
    u32 pid;           /* the victim */
    u64 ts;
    u64 total_vm_kb;
    u64 anon_rss_kb;
    u64 file_rss_kb;
    u64 shmem_rss_kb;
    u32 uid;
    s32 oom_score_adj;
    u32 trigger_tgid;  /* the process whose allocation ran out of memory */
    u32 _pad2;
    char comm[16];     /* the victim's, from the tracepoint */
};

#endif /* OE_MEMORY_H */
