/* Memory: page faults per traced process (exceptions:page_fault_user, counted in a per-CPU
 * hash) and OOM kills (oom:mark_victim, one ring-buffer record each). RSS is not traced: the
 * rss_stat tracepoint fires on every RSS counter change, while /proc/PID/statm, read by the
 * receiver every interval, costs one read per process. Tracepoint args only.
 *
 * MM_FAULT_TP=0 where exceptions:page_fault_user does not exist (it is x86-only): the
 * receiver then reads fault counts from /proc/PID/stat.
 * MM_OOM_DETAIL=0 where mark_victim has only the pid (kernels before 6.1 lack the sizes).
 */
#include "memory.h"

#ifndef MM_MAX_PIDS
#define MM_MAX_PIDS 16384
#endif
#ifndef MM_FAULT_TP
#define MM_FAULT_TP 1
#endif
#ifndef MM_OOM_DETAIL
#define MM_OOM_DETAIL 1
#endif

#if MM_FAULT_TP
BPF_PERCPU_HASH(mm_faults, u32, u64, MM_MAX_PIDS);

TRACEPOINT_PROBE(exceptions, page_fault_user)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!oe_is_traced(tgid))
        return 0;
    u64 *n = mm_faults.lookup(&tgid);
    if (n) {
        *n += 1;
        return 0;
    }
    u64 one = 1;
    if (mm_faults.update(&tgid, &one) != 0)
        oe_drop(OE_DROP_STATSMAP);
    return 0;
}
#endif

TRACEPOINT_PROBE(oom, mark_victim)
{
    u32 victim = args->pid;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!oe_is_traced(victim) && !oe_is_traced(tgid))
        return 0;
    struct mm_oom_rec *e = events.ringbuf_reserve(sizeof(struct mm_oom_rec));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = MM_EV_OOM_KILL;
    e->pid = victim;
    e->ts = bpf_ktime_get_ns();
    e->trigger_tgid = tgid;
#if MM_OOM_DETAIL
    e->total_vm_kb = args->total_vm;
    e->anon_rss_kb = args->anon_rss;
    e->file_rss_kb = args->file_rss;
    e->shmem_rss_kb = args->shmem_rss;
    e->uid = args->uid;
    e->oom_score_adj = args->oom_score_adj;
    unsigned short off = args->data_loc_comm & 0xFFFF;
    bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), (char *)args + off);
#endif
    events.ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
    return 0;
}
