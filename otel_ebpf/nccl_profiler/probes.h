/*
 * The USDT probes of otel-ebpf's NCCL profiler plugin (libnccl-profiler-otel_ebpf): the one
 * contract between the plugin (plugin.c, in the traced application) and the agent's NCCL
 * receiver (otel_ebpf/receivers/nccl), which attaches to them with BCC.
 *
 * Provider: otel_ebpf_nccl. Every probe has a semaphore (sys/sdt.h _SEMAPHORE form): the
 * agent's attach raises it. With no agent attached the plugin keeps NCCL's activation mask at
 * ncclProfileGroupApi only (NCCL 2.28.9 src/plugin/profiler.cc reads the mask,
 * ncclProfilerEventMask, at every group API call), so NCCL makes no other profiler call and
 * each ncclGroupStart/implicit group costs one call and one branch; the first group API event
 * that sees a semaphore raised widens the mask to GroupApi|CollApi|P2pApi|Group|Coll|P2p|
 * KernelCh (and narrows it again once none is). The semaphores that widen it: group_start,
 * api_start, coll_start, p2p_start, kernel_ch_start, kernel_ch_stop, event_stop. NCCL loaded
 * the mask for the collective in progress before that event, so the group during which an agent
 * attaches is recorded from its second collective on, if at all. An event fires its start probe
 * when that probe's semaphore is raised at its start; its kernel_ch_stop/event_stop fire only
 * then.
 *
 * Handles: every event the plugin starts gets a handle unique in its process while the event
 * lives (NCCL gives it back at stop and recordEventState); 0 is never a handle. As implemented,
 * handles are never reused within a process (a counter; the low 4 bits are the event's
 * ncclProfile* bit index, bit 4 says it fired its start probe). Parents are handles too (a
 * collective's group, a kernel channel's collective or p2p); 0: none known (not recorded, e.g.
 * started before the agent attached). A parent may have stopped already: NCCL 2.28.9 stops a
 * CollApi event before its Coll starts, and a Coll/P2p (hostStreamPlanTask) before its proxy
 * thread starts the kernel channels.
 * A context is the plugin's per-communicator object (init -> finalize), named by a process-
 * unique id, never 0.
 *
 * Records are passed by address; the receiver copies them with bpf_probe_read_user, so their
 * layout below is ABI: fields only ever appended, OE_NCCL_PROBES_VERSION raised when changed.
 * Strings are NCCL's own (func "AllReduce", datatype "ncclFloat32", algo "RING", proto
 * "SIMPLE"), copied NUL-terminated and cut to the array size.
 *
 * Times: probes carry no host time (the receiver takes bpf_ktime_get_ns()); GPU times are
 * NCCL's pTimer values, the GPU's %globaltimer in ns (converted to epoch in one place on the
 * agent side).
 */
#ifndef OE_NCCL_PROBES_H
#define OE_NCCL_PROBES_H

/* BCC compiles BPF C with the kernel's headers (__BPF_TRACING__), whose linux/types.h already
 * has uint64_t, int32_t, uint8_t; user space takes them from stdint.h. */
#ifndef __BPF_TRACING__
#include <stdint.h>
#endif

#define OE_NCCL_PROBES_VERSION 1
#define OE_NCCL_STR 24

/* otel_ebpf_nccl:comm_init(uint64_t context, const struct oe_nccl_comm_rec *rec)
 * After NCCL called init for a communicator (ncclCommInitRank*, ncclCommSplit, ...), and again
 * for every live communicator at the first group API event after comm_init's semaphore rose:
 * an agent that attaches after NCCL's init (the usual case: NCCL loads the plugin at its first
 * init) learns the communicators there, before their first recorded collective. The same
 * context may thus be announced more than once, always with the same record. */
struct oe_nccl_comm_rec {
    uint64_t comm_hash; /* NCCL's commId argument (comm->commHash): the same on every rank */
    int32_t rank;
    int32_t nranks;
    int32_t nnodes;
    uint32_t version;   /* OE_NCCL_PROBES_VERSION */
    char name[64];      /* commName (config.commName), "" if none */
};

/* otel_ebpf_nccl:comm_finalize(uint64_t context) */

/* otel_ebpf_nccl:group_start(uint64_t handle, uint64_t context)
 * A ncclProfileGroup event (one per kernel plan: the collectives and p2p launched together). */

/* otel_ebpf_nccl:api_start(uint64_t handle, uint64_t type)
 * A ncclProfileCollApi or ncclProfileP2pApi event (type: that bit): NCCL starts it inside the
 * application's ncclAllReduce/ncclSend/... call, on the calling thread (NCCL 2.28.9
 * src/enqueue.cc ncclEnqueueCheck -> ncclProfilerStartCollApiEvent), so the receiver ties the
 * handle to the call its uprobe sees in flight on that thread. The Coll/P2p event of the same
 * call names it as its parentObj (rec->api below). Stopped through event_stop. */

/* otel_ebpf_nccl:coll_start(uint64_t handle, const struct oe_nccl_coll_rec *rec)
 * A ncclProfileColl event (descr->coll). */
struct oe_nccl_coll_rec {
    uint64_t context;
    uint64_t parent;    /* the group's handle */
    uint64_t seq;       /* coll.seqNumber: comm->seqNumber[func], counted per function */
    uint64_t count;
    uint64_t send_buff;
    uint64_t recv_buff;
    int32_t root;
    uint8_t nchannels;
    uint8_t nwarps;
    uint8_t _pad[2];
    char func[OE_NCCL_STR];
    char datatype[OE_NCCL_STR];
    char algo[OE_NCCL_STR];
    char proto[OE_NCCL_STR];
    uint64_t api;       /* descr->parentObj: the CollApi event's handle (api_start), 0 if none */
};

/* otel_ebpf_nccl:p2p_start(uint64_t handle, const struct oe_nccl_p2p_rec *rec)
 * A ncclProfileP2p event (descr->p2p). */
struct oe_nccl_p2p_rec {
    uint64_t context;
    uint64_t parent;    /* the group's handle */
    uint64_t count;
    uint64_t buff;
    int32_t peer;
    uint8_t nchannels;
    uint8_t _pad[3];
    char func[OE_NCCL_STR];
    char datatype[OE_NCCL_STR];
    uint64_t api;       /* descr->parentObj: the P2pApi event's handle (api_start), 0 if none */
};

/* otel_ebpf_nccl:kernel_ch_start(uint64_t handle, uint64_t parent, uint32_t channel, uint64_t ptimer)
 * A ncclProfileKernelCh event: channel `channel` of the parent collective/p2p's kernel started
 * at GPU time ptimer (descr->kernelCh.pTimer). */

/* otel_ebpf_nccl:kernel_ch_stop(uint64_t handle, uint64_t ptimer)
 * recordEventState(ncclProfilerKernelChStop): the channel's work ended at GPU time ptimer. */

/* otel_ebpf_nccl:event_stop(uint64_t handle, uint64_t type)
 * stopEvent of any event that fired a start probe (group_start, api_start, coll_start,
 * p2p_start, kernel_ch_start); type: NCCL's ncclProfile* bit of it (Group 1, Coll 2, P2p 4,
 * KernelCh 64, CollApi 512, P2pApi 1024). */

#endif
