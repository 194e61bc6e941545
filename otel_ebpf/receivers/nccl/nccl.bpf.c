/* NCCL receiver: uprobes/uretprobes on libnccl.so.2's host API (NCCL 2.x, checked on 2.32.3).
 * common.bpf.c is prepended (traced set, ring buffer "events", drops[]); records in nccl.h.
 *
 * Captured calls: a collective, send/recv or group made while its thread has a CUDA stream capture open
 * (oe_thread_ctx.capture, kept by the cuda program of the same agent: common.bpf.c) is recorded into a CUDA
 * graph, not run (NCCL 2.28.9 src/enqueue.cc: ncclLaunchPrepare makes a persistent plan when the stream is
 * capturing, and each cudaGraphLaunch runs it); its record carries NCCL_F_CAPTURED / NCCL_GROUP_F_CAPTURED.
 * Without the cuda receiver nothing keeps captures, and no call is marked.
 *
 * Entry probes save the arguments per thread (calls/inits/ctls, keyed by pid_tgid); return
 * probes pair them with the return code and submit one record, so a record always has both
 * times. Arguments follow the x86-64 SysV ABI: integer args in rdi, rsi, rdx, rcx, r8, r9,
 * the rest on the stack at 8(%rsp), 16(%rsp)... at the first instruction (0(%rsp) holds the
 * return address). ncclUniqueId (128 bytes) is passed BY VALUE and is MEMORY class, so the
 * caller copies it to 8(%rsp)..135(%rsp) and it takes no register: in
 * ncclCommInitRank(ncclComm_t*, int nranks, ncclUniqueId, int rank) rank is in EDX.
 *
 * Sequence numbers live here, keyed by (process, communicator handle), so they count every
 * call even when Python drops records: a collective that returned ncclSuccess or
 * ncclInProgress takes the next number of its communicator; ncclSend/ncclRecv count
 * separately per (communicator, peer, direction), so send #k A->B matches recv #k at B from A.
 * A communicator whose creation was not seen (probes attached late, or comms full) has no
 * state here and its calls carry no NCCL_F_SEQ. A call takes its communicator's generation (and
 * next collective number) at ENTRY: ncclCommAbort, called from another thread while a thread is
 * blocked inside a call on that communicator (NCCL 2.28.9 src/init.cc ncclCommAbort; PyTorch's
 * watchdog does it), forgets the state before the blocked call returns, and that call is still
 * numbered: a collective with the number it would have taken at entry, a send/recv by its
 * generation's p2p counter (p2p_seq is keyed by generation and outlives the state).
 *
 * Non-blocking ncclCommSplit (config.blocking = 0) returns with *newcomm still NULL: NCCL
 * 2.28.9 src/init.cc ncclCommInitChildComm sets it to NCCL_COMM_NULL and its init thread
 * (ncclCommInitRankFunc) stores the child into the caller's *newcomm when the child is ready.
 * The return code is ncclSuccess, not ncclInProgress: ncclCommSplit's
 * NCCLCHECK(ncclGroupEndInternal()) lets the group's ncclInProgress through as success
 * (src/include/checks.h). So a split (or shrink, made the same way) that returned success or
 * in-progress with no handle and a color has a child to come, published at the address the
 * caller passed as newcomm. nb_pending keeps those addresses per process (NCCL_MAX_PENDING
 * slots; a full table is a counted STATEMAP drop). PyTorch 2.11 passes &comm->ncclComm_, a
 * member of the child's own heap NCCLComm (c10d NCCLUtils.cpp NCCLComm::split), which keeps the
 * handle while the child lives, so two pending children never share an address. The first
 * probed call on a handle the process has no state for (a collective, a send/recv, a split or
 * shrink of it, its destroy) reads each pending address of its process (bpf_probe_read_user)
 * and binds the handle to the child whose address holds it: exactly that child, whatever the
 * order the children were made and used in. The match frees the slot, numbers the child's
 * calls from 0 and submits a nccl_comm_bind record (before the call's own record) naming the
 * address, which the split record carries too (processors/nccl/splits.py binds by it). An
 * unreadable address is skipped and counted (counters[2]); no creation-order guess is made: a
 * call on a handle no pending address holds stays unnumbered (unknown communicator).
 * A blocking split always returns the handle. ncclCommInitRankConfig in non-blocking mode
 * returns ncclInProgress with *newcomm already set (ncclCommInitRankDev), read as issued.
 *
 * Parameters (-D): NCCL_MAX_INFLIGHT (threads inside a probed call at once),
 * NCCL_MAX_COMMS (live communicators), NCCL_MAX_P2P (p2p counters, LRU), NCCL_MAX_PENDING
 * (non-blocking children per process waiting for their handle, a power of 2).
 */
#include "nccl.h"

#ifndef NCCL_MAX_INFLIGHT
#define NCCL_MAX_INFLIGHT 10240
#endif
#ifndef NCCL_MAX_COMMS
#define NCCL_MAX_COMMS 4096
#endif
#ifndef NCCL_MAX_P2P
#define NCCL_MAX_P2P 65536
#endif

#ifndef NCCL_MAX_PENDING
#define NCCL_MAX_PENDING 32
#endif

#define NCCL_RC_IN_PROGRESS 7
#define NCCL_COUNTER_UNREADABLE 2  /* counters[]: pending addresses that could not be read */
#define NCCL_COUNTER_GPU_OPS_FULL 3  /* profiler ops not timed: prof_ops full (nccl_prof.bpf.c) */
#define NCCL_COUNTER_GPU_CHS_FULL 4  /* kernel channels not timed: prof_chs full */

_Static_assert(NCCL_INIT_ALL_MAX == 32, "nccl_init_all_return masks indexes with 31");

/* ---- per-thread state of a call in progress ---- */

struct nccl_call {
    u64 ts;
    u64 comm;
    u64 count;
    u64 stream;
    u64 group;
    u64 gen;  /* the communicator's generation at entry, 0: unknown then */
    u64 seq;  /* its next collective number at entry (used only if it ended before the return) */
    s32 datatype;
    s32 redop;
    s32 root;
    s32 peer;
    u8 op;
    u8 _pad[7];
    u64 api;  /* the profiler plugin's CollApi/P2pApi handle started inside this call (nccl_prof.bpf.c) */
};

struct nccl_init_call {
    u64 ts;
    u64 commp;
    s32 nranks;
    s32 rank;
    u8 kind;
    u8 _pad[7];
    u8 id[NCCL_UNIQUE_ID_BYTES];
};

#define NCCL_CTL_SPLIT 1
#define NCCL_CTL_END 2
#define NCCL_CTL_INFO 3
#define NCCL_CTL_INIT_ALL 4
#define NCCL_CTL_SHRINK 5

struct nccl_ctl_call {
    u64 ts;
    u64 a;     /* comm / parent / comms array */
    u64 b;     /* out pointer / devlist */
    u64 c;     /* shrink: excludeRanksList */
    s32 i;     /* color / ndev / excludeRanksCount */
    s32 j;     /* key / shrinkFlags */
    u8 fn;     /* NCCL_CTL_* */
    u8 kind;   /* NCCL_END_* / NCCL_INFO_* */
    u8 _pad[6];
};

struct nccl_comm_key {
    u32 tgid;
    u32 _pad;
    u64 comm;
};

struct nccl_comm_state {
    u64 seq;
    u64 gen;  /* unique per communicator instance: handles are reused after free */
};

struct nccl_p2p_key {
    u32 tgid;
    s32 peer;
    u64 gen;
    u32 dir;  /* 0 send, 1 recv */
    u32 _pad;
};

struct nccl_group_state {
    u64 group;
    u64 ts;
    u32 depth;
    u32 members;
    u32 p2p;
    u32 sim;  /* the outermost end is ncclGroupSimulateEnd(simInfo != NULL) */
};

BPF_HASH(calls, u64, struct nccl_call, NCCL_MAX_INFLIGHT);
BPF_HASH(inits, u64, struct nccl_init_call, 1024);
BPF_HASH(ctls, u64, struct nccl_ctl_call, NCCL_MAX_INFLIGHT);
BPF_HASH(groups, u64, struct nccl_group_state, NCCL_MAX_INFLIGHT);
BPF_HASH(comms, struct nccl_comm_key, struct nccl_comm_state, NCCL_MAX_COMMS);
BPF_TABLE("lru_hash", struct nccl_p2p_key, u64, p2p_seq, NCCL_MAX_P2P);
/* The newcomm addresses of one process's non-blocking children still without a handle; 0: free slot. */
struct nccl_pending {
    u64 newcomm[NCCL_MAX_PENDING];
};

BPF_HASH(nb_pending, u32, struct nccl_pending, 1024);  /* tgid -> its pending children */
BPF_ARRAY(counters, u64, 5);  /* [0] group ids, [1] communicator generations, [2..4] NCCL_COUNTER_* losses */

static __always_inline int nccl_issued(s32 rc)
{
    return rc == 0 || rc == NCCL_RC_IN_PROGRESS;
}

static __always_inline u64 nccl_next(int idx)
{
    u64 *v = counters.lookup(&idx);
    if (!v)
        return 0;
    return __sync_fetch_and_add(v, 1) + 1;
}

/* One more loss of kind `idx` (NCCL_COUNTER_*), read by the receiver's poll_maps. */
static __always_inline void nccl_count(int idx)
{
    u64 *n = counters.lookup(&idx);
    if (n)
        __sync_fetch_and_add(n, 1);
}

static __always_inline void nccl_comm_new(u32 tgid, u64 comm)
{
    if (comm == 0)
        return;
    struct nccl_comm_key k = {};
    k.tgid = tgid;
    k.comm = comm;
    struct nccl_comm_state st = {};
    st.gen = nccl_next(1);
    if (comms.update(&k, &st) != 0)
        oe_drop(OE_DROP_STATEMAP);
}

static __always_inline void nccl_comm_forget(u32 tgid, u64 comm)
{
    struct nccl_comm_key k = {};
    k.tgid = tgid;
    k.comm = comm;
    comms.delete(&k);
}

static __always_inline u64 nccl_read_u64(u64 addr)
{
    u64 v = 0;
    if (addr)
        bpf_probe_read_user(&v, sizeof(v), (void *)addr);
    return v;
}

_Static_assert((NCCL_MAX_PENDING & (NCCL_MAX_PENDING - 1)) == 0, "NCCL_MAX_PENDING must be a power of 2");

/* The pending slot (of *p) whose newcomm address now holds comm, or -1 (see the file's comment). */
static __always_inline int nccl_pending_find(struct nccl_pending *p, u64 comm)
{
    for (int i = 0; i < NCCL_MAX_PENDING; i++) {
        u64 addr = p->newcomm[i];
        if (addr == 0)
            continue;
        u64 v = 0;
        if (bpf_probe_read_user(&v, sizeof(v), (void *)addr) != 0) {
            nccl_count(NCCL_COUNTER_UNREADABLE);
            continue;
        }
        if (v == comm)
            return i;
    }
    return -1;
}

/* The state of the process's communicator comm, or NULL. A handle without state may be a non-blocking
 * child's, published since its split returned: bound here, exactly (the file's comment). id: pid_tgid. */
static __always_inline struct nccl_comm_state *nccl_comm_state_of(u64 id, u64 comm)
{
    u32 tgid = id >> 32;
    struct nccl_comm_key k = {};
    k.tgid = tgid;
    k.comm = comm;
    struct nccl_comm_state *st = comms.lookup(&k);
    if (st || comm == 0)
        return st;
    struct nccl_pending *p = nb_pending.lookup(&tgid);
    if (!p)
        return 0;
    int i = nccl_pending_find(p, comm);
    if (i < 0)
        return 0;
    u64 slot = (u64)i & (NCCL_MAX_PENDING - 1);
    u64 addr = p->newcomm[slot];
    p->newcomm[slot] = 0;
    nccl_comm_new(tgid, comm);
    struct nccl_comm_bind *e = events.ringbuf_reserve(sizeof(struct nccl_comm_bind));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
    } else {
        __builtin_memset(e, 0, sizeof(*e));
        e->type = NCCL_EV_COMM_BIND;
        e->pid = tgid;
        e->tid = (u32)id;
        e->ts = bpf_ktime_get_ns();
        e->comm = comm;
        e->newcomm = addr;
        events.ringbuf_submit(e, oe_wakeup_flags());
    }
    return comms.lookup(&k);
}

/* A thread that dies inside a probed call (a killed rank, a crash) never returns: free its
 * per-thread state. Attached by receiver.py to sched:sched_process_exit (every thread). The
 * per-process comms entries of processes that exit without ncclCommDestroy are swept from
 * Python (receiver.py _sweep), as a BPF program cannot walk a hash map cheaply here. */
int nccl_thread_exit(void *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    calls.delete(&id);
    ctls.delete(&id);
    inits.delete(&id);
    groups.delete(&id);
    return 0;
}

/* ---- collectives and point-to-point ---- */

static __always_inline int nccl_enter(u8 op, u64 count, s32 datatype, s32 redop, s32 root, s32 peer,
                                      u64 comm, u64 stream)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct nccl_call c = {};
    c.ts = bpf_ktime_get_ns();
    c.op = op;
    c.count = count;
    c.datatype = datatype;
    c.redop = redop;
    c.root = root;
    c.peer = peer;
    c.comm = comm;
    c.stream = stream;
    struct nccl_comm_state *st = nccl_comm_state_of(id, comm);
    if (st) {
        c.gen = st->gen;
        c.seq = st->seq;
    }
    struct nccl_group_state *g = groups.lookup(&id);
    if (g && g->depth > 0) {
        c.group = g->group;
        g->members += 1;
        if (op == NCCL_OP_SEND || op == NCCL_OP_RECV)
            g->p2p += 1;
    }
    if (calls.update(&id, &c) != 0)
        oe_drop(OE_DROP_STATEMAP);
    return 0;
}

static __always_inline u64 nccl_stack_arg(struct pt_regs *ctx, int slot)
{
    return nccl_read_u64(PT_REGS_SP(ctx) + 8 * slot);
}

/* (sendbuff, recvbuff, count, datatype, op, comm, stream) */
int nccl_all_reduce_enter(struct pt_regs *ctx)
{
    return nccl_enter(NCCL_OP_ALL_REDUCE, PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx),
                      (s32)PT_REGS_PARM5(ctx), -1, -1, PT_REGS_PARM6(ctx), nccl_stack_arg(ctx, 1));
}

/* (sendbuff, recvbuff, recvcount, datatype, op, comm, stream) */
int nccl_reduce_scatter_enter(struct pt_regs *ctx)
{
    return nccl_enter(NCCL_OP_REDUCE_SCATTER, PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx),
                      (s32)PT_REGS_PARM5(ctx), -1, -1, PT_REGS_PARM6(ctx), nccl_stack_arg(ctx, 1));
}

/* (sendbuff, recvbuff, count, datatype, root, comm, stream): Broadcast, Gather, Scatter */
static __always_inline int nccl_rooted_enter(struct pt_regs *ctx, u8 op)
{
    return nccl_enter(op, PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), -1, (s32)PT_REGS_PARM5(ctx), -1,
                      PT_REGS_PARM6(ctx), nccl_stack_arg(ctx, 1));
}

int nccl_broadcast_enter(struct pt_regs *ctx) { return nccl_rooted_enter(ctx, NCCL_OP_BROADCAST); }
int nccl_gather_enter(struct pt_regs *ctx) { return nccl_rooted_enter(ctx, NCCL_OP_GATHER); }
int nccl_scatter_enter(struct pt_regs *ctx) { return nccl_rooted_enter(ctx, NCCL_OP_SCATTER); }

/* (sendbuff, recvbuff, count, datatype, op, root, comm, stream) */
int nccl_reduce_enter(struct pt_regs *ctx)
{
    return nccl_enter(NCCL_OP_REDUCE, PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), (s32)PT_REGS_PARM5(ctx),
                      (s32)PT_REGS_PARM6(ctx), -1, nccl_stack_arg(ctx, 1), nccl_stack_arg(ctx, 2));
}

/* (sendbuff, recvbuff, count, datatype, comm, stream): AllGather, AlltoAll */
int nccl_all_gather_enter(struct pt_regs *ctx)
{
    return nccl_enter(NCCL_OP_ALL_GATHER, PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), -1, -1, -1,
                      PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

int nccl_all_to_all_enter(struct pt_regs *ctx)
{
    return nccl_enter(NCCL_OP_ALL_TO_ALL, PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM4(ctx), -1, -1, -1,
                      PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

/* (buff, count, datatype, peer, comm, stream) */
int nccl_send_enter(struct pt_regs *ctx)
{
    return nccl_enter(NCCL_OP_SEND, PT_REGS_PARM2(ctx), (s32)PT_REGS_PARM3(ctx), -1, -1,
                      (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

int nccl_recv_enter(struct pt_regs *ctx)
{
    return nccl_enter(NCCL_OP_RECV, PT_REGS_PARM2(ctx), (s32)PT_REGS_PARM3(ctx), -1, -1,
                      (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

static __always_inline u64 nccl_p2p_next(u32 tgid, u64 gen, s32 peer, u32 dir)
{
    struct nccl_p2p_key k = {};
    k.tgid = tgid;
    k.peer = peer;
    k.gen = gen;
    k.dir = dir;
    u64 zero = 0;
    u64 *v = p2p_seq.lookup_or_try_init(&k, &zero);
    if (!v) {
        oe_drop(OE_DROP_STATEMAP);
        return (u64)-1;
    }
    return __sync_fetch_and_add(v, 1);
}

/* The number is taken before the record is reserved: a record dropped on a full ring buffer leaves
 * a gap and never shifts the numbers of later calls, which the join across ranks depends on. */
static __always_inline int nccl_submit_p2p(struct nccl_call *c, u64 id, s32 rc, u64 now)
{
    u64 seq = (u64)-1;
    if (c->gen && nccl_issued(rc))
        seq = nccl_p2p_next(id >> 32, c->gen, c->peer, c->op == NCCL_OP_RECV);
    struct nccl_p2p *e = events.ringbuf_reserve(sizeof(struct nccl_p2p));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = NCCL_EV_P2P;
    e->op = c->op;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->rc = rc;
    e->datatype = c->datatype;
    e->peer = c->peer;
    e->ts_start = c->ts;
    e->ts_end = now;
    e->count = c->count;
    e->comm = c->comm;
    e->stream = c->stream;
    e->group = c->group;
    e->api = c->api;
    if (seq != (u64)-1) {
        e->seq = seq;
        e->flags = NCCL_F_SEQ;
    }
    if (oe_capture_depth((u32)id))
        e->flags |= NCCL_F_CAPTURED;
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

static __always_inline int nccl_submit_coll(struct nccl_call *c, u64 id, s32 rc, u64 now,
                                            struct nccl_comm_state *st)
{
    int numbered = c->gen && nccl_issued(rc);
    /* st NULL: the communicator ended (ncclCommAbort from another thread) while this call was inside:
     * the number it would have taken at entry (one thread at a time uses a communicator) */
    u64 seq = !numbered ? 0 : st ? __sync_fetch_and_add(&st->seq, 1) : c->seq;
    struct nccl_coll *e = events.ringbuf_reserve(sizeof(struct nccl_coll));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = NCCL_EV_COLL;
    e->op = c->op;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->rc = rc;
    e->datatype = c->datatype;
    e->redop = c->redop;
    e->root = c->root;
    e->ts_start = c->ts;
    e->ts_end = now;
    e->count = c->count;
    e->comm = c->comm;
    e->stream = c->stream;
    e->group = c->group;
    e->api = c->api;
    if (numbered) {
        e->seq = seq;
        e->flags = NCCL_F_SEQ;
    }
    if (oe_capture_depth((u32)id))
        e->flags |= NCCL_F_CAPTURED;
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

/* One return probe for every collective and p2p call: the saved op says which. */
int nccl_call_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_call *c = calls.lookup(&id);
    if (!c)
        return 0;
    s32 rc = (s32)PT_REGS_RC(ctx);
    struct nccl_comm_key k = {};
    k.tgid = id >> 32;
    k.comm = c->comm;
    struct nccl_comm_state *st = c->gen ? comms.lookup(&k) : 0;
    if (st && st->gen != c->gen)
        st = 0;  /* the handle is a newer communicator's: this call's ended meanwhile */
    if (c->op == NCCL_OP_SEND || c->op == NCCL_OP_RECV)
        nccl_submit_p2p(c, id, rc, now);
    else
        nccl_submit_coll(c, id, rc, now, st);
    calls.delete(&id);
    return 0;
}

/* ---- groups ---- */

int nccl_group_start_enter(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct nccl_group_state *g = groups.lookup(&id);
    if (g) {
        g->depth += 1;
        return 0;
    }
    struct nccl_group_state st = {};
    st.group = nccl_next(0);
    st.ts = bpf_ktime_get_ns();
    st.depth = 1;
    if (groups.update(&id, &st) != 0)
        oe_drop(OE_DROP_STATEMAP);
    return 0;
}

/* ncclGroupSimulateEnd(ncclSimInfo_t* simInfo): NCCL 2.28.9 src/group.cc ncclGroupEndInternal(simInfo)
 * closes only the OUTERMOST group as a simulation (inner ends just count down), and only with a simInfo and a
 * blocking group: a non-blocking group is launched anyway (groupLaunchNonBlocking passes no simInfo) and the
 * call returns ncclInProgress. So the group is simulated when the outermost end had a simInfo and returned
 * ncclSuccess; then nothing ran: its members' sequence numbers are given back by the processor. */
int nccl_group_sim_end_enter(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_group_state *g = groups.lookup(&id);
    if (g && g->depth == 1)
        g->sim = PT_REGS_PARM1(ctx) != 0;
    return 0;
}

int nccl_group_end_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_group_state *g = groups.lookup(&id);
    if (!g)
        return 0;
    if (g->depth > 1) {
        g->depth -= 1;
        return 0;
    }
    s32 rc = (s32)PT_REGS_RC(ctx);
    struct nccl_group *e = events.ringbuf_reserve(sizeof(struct nccl_group));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
    } else {
        __builtin_memset(e, 0, sizeof(*e));
        e->type = NCCL_EV_GROUP;
        e->flags = (g->sim && rc == 0) ? NCCL_GROUP_F_SIMULATED : 0;
        if (oe_capture_depth((u32)id))
            e->flags |= NCCL_GROUP_F_CAPTURED;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->rc = rc;
        e->members = g->members;
        e->p2p = g->p2p;
        e->ts_start = g->ts;
        e->ts_end = now;
        e->group = g->group;
        events.ringbuf_submit(e, oe_wakeup_flags());
    }
    groups.delete(&id);
    return 0;
}

/* ---- communicator creation from a unique id ---- */

static __always_inline int nccl_init_enter(struct pt_regs *ctx, u8 kind, u64 id_addr)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct nccl_init_call c = {};
    c.ts = bpf_ktime_get_ns();
    c.kind = kind;
    c.commp = PT_REGS_PARM1(ctx);
    c.nranks = (s32)PT_REGS_PARM2(ctx);
    c.rank = (s32)PT_REGS_PARM3(ctx);
    if (id_addr)
        bpf_probe_read_user(c.id, sizeof(c.id), (void *)id_addr);
    if (inits.update(&id, &c) != 0)
        oe_drop(OE_DROP_STATEMAP);
    return 0;
}

/* (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank): the id is on the stack */
int nccl_init_rank_enter(struct pt_regs *ctx)
{
    return nccl_init_enter(ctx, NCCL_INIT_RANK, PT_REGS_SP(ctx) + 8);
}

/* (..., int rank, ncclConfig_t* config): as above, config in rcx */
int nccl_init_rank_config_enter(struct pt_regs *ctx)
{
    return nccl_init_enter(ctx, NCCL_INIT_RANK_CONFIG, PT_REGS_SP(ctx) + 8);
}

/* (ncclComm_t* newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds, config):
 * every rank passes the same array; the first id names the communicator. */
int nccl_init_rank_scalable_enter(struct pt_regs *ctx)
{
    return nccl_init_enter(ctx, NCCL_INIT_RANK_SCALABLE, PT_REGS_PARM5(ctx));
}

int nccl_init_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_init_call *c = inits.lookup(&id);
    if (!c)
        return 0;
    s32 rc = (s32)PT_REGS_RC(ctx);
    u64 comm = nccl_issued(rc) ? nccl_read_u64(c->commp) : 0;
    if (comm)
        nccl_comm_new(id >> 32, comm);
    struct nccl_comm_init *e = events.ringbuf_reserve(sizeof(struct nccl_comm_init));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        inits.delete(&id);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = NCCL_EV_COMM_INIT;
    e->kind = c->kind;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->rc = rc;
    e->nranks = c->nranks;
    e->rank = c->rank;
    e->ts_start = c->ts;
    e->ts_end = now;
    e->comm = comm;
    __builtin_memcpy(e->id, c->id, sizeof(e->id));
    events.ringbuf_submit(e, oe_wakeup_flags());
    inits.delete(&id);
    return 0;
}

/* ---- other communicator calls (split, destroy/abort, queries, InitAll) ---- */

static __always_inline int nccl_ctl_enter(u8 fn, u8 kind, u64 a, u64 b, s32 i, s32 j)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct nccl_ctl_call c = {};
    c.ts = bpf_ktime_get_ns();
    c.fn = fn;
    c.kind = kind;
    c.a = a;
    c.b = b;
    c.i = i;
    c.j = j;
    if (ctls.update(&id, &c) != 0)
        oe_drop(OE_DROP_STATEMAP);
    return 0;
}

/* A non-blocking split's or shrink's child whose handle comes later, at newcomm (see the file's comment).
 * An address already pending is kept once: the earlier child's NCCLComm was freed and its memory reused. */
static __always_inline void nccl_pending_child(u32 tgid, u64 newcomm)
{
    struct nccl_pending empty = {};
    struct nccl_pending *p = nb_pending.lookup_or_try_init(&tgid, &empty);
    if (!p || newcomm == 0) {
        oe_drop(OE_DROP_STATEMAP);
        return;
    }
    int free = -1;
    for (int i = 0; i < NCCL_MAX_PENDING; i++) {
        if (p->newcomm[i] == newcomm)
            return;
        if (free < 0 && p->newcomm[i] == 0)
            free = i;
    }
    if (free < 0) {
        oe_drop(OE_DROP_STATEMAP);
        return;
    }
    p->newcomm[(u64)free & (NCCL_MAX_PENDING - 1)] = newcomm;
}

/* Return probes check fn, so a nested probed call cannot be paired with the wrong one. */
static __always_inline struct nccl_ctl_call *nccl_ctl_take(u64 id, u8 fn)
{
    struct nccl_ctl_call *c = ctls.lookup(&id);
    if (c && c->fn != fn)
        return 0;
    return c;
}

/* (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) */
int nccl_split_enter(struct pt_regs *ctx)
{
    return nccl_ctl_enter(NCCL_CTL_SPLIT, 0, PT_REGS_PARM1(ctx), PT_REGS_PARM4(ctx),
                          (s32)PT_REGS_PARM2(ctx), (s32)PT_REGS_PARM3(ctx));
}

int nccl_split_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_ctl_call *c = nccl_ctl_take(id, NCCL_CTL_SPLIT);
    if (!c)
        return 0;
    s32 rc = (s32)PT_REGS_RC(ctx);
    nccl_comm_state_of(id, c->a);  /* a parent that is a pending child: bound (record) before the split's */
    u64 child = nccl_issued(rc) ? nccl_read_u64(c->b) : 0;
    if (child)
        nccl_comm_new(id >> 32, child);
    else if (nccl_issued(rc) && c->i != -1)  /* -1: NCCL_SPLIT_NOCOLOR, no child */
        nccl_pending_child(id >> 32, c->b);
    struct nccl_comm_split *e = events.ringbuf_reserve(sizeof(struct nccl_comm_split));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
    } else {
        __builtin_memset(e, 0, sizeof(*e));
        e->type = NCCL_EV_COMM_SPLIT;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->rc = rc;
        e->color = c->i;
        e->key = c->j;
        e->ts_start = c->ts;
        e->ts_end = now;
        e->parent = c->a;
        e->comm = child;
        e->newcomm = c->b;
        events.ringbuf_submit(e, oe_wakeup_flags());
    }
    ctls.delete(&id);
    return 0;
}

/* (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config,
 *  int shrinkFlags): NCCL >= 2.27. The child is made as a split's (src/init.cc ncclCommShrink ->
 * ncclCommInitChildComm), so a non-blocking shrink also returns with *newcomm NULL: pending as a split's. */
int nccl_shrink_enter(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!oe_is_traced(id >> 32))
        return 0;
    struct nccl_ctl_call c = {};
    c.ts = bpf_ktime_get_ns();
    c.fn = NCCL_CTL_SHRINK;
    c.a = PT_REGS_PARM1(ctx);
    c.b = PT_REGS_PARM4(ctx);
    c.c = PT_REGS_PARM2(ctx);
    c.i = (s32)PT_REGS_PARM3(ctx);
    c.j = (s32)PT_REGS_PARM6(ctx);
    if (ctls.update(&id, &c) != 0)
        oe_drop(OE_DROP_STATEMAP);
    return 0;
}

int nccl_shrink_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_ctl_call *c = nccl_ctl_take(id, NCCL_CTL_SHRINK);
    if (!c)
        return 0;
    s32 rc = (s32)PT_REGS_RC(ctx);
    nccl_comm_state_of(id, c->a);
    u64 child = nccl_issued(rc) ? nccl_read_u64(c->b) : 0;
    if (child)
        nccl_comm_new(id >> 32, child);
    else if (nccl_issued(rc))
        nccl_pending_child(id >> 32, c->b);
    struct nccl_comm_shrink *e = events.ringbuf_reserve(sizeof(struct nccl_comm_shrink));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        ctls.delete(&id);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = NCCL_EV_COMM_SHRINK;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->rc = rc;
    e->nexcluded = c->i;
    e->flags = c->j;
    e->ts_start = c->ts;
    e->ts_end = now;
    e->parent = c->a;
    e->comm = child;
    e->newcomm = c->b;
    _Static_assert(NCCL_SHRINK_MAX == 64, "nccl_shrink_return masks the count with 63");
    if (c->c && c->i >= NCCL_SHRINK_MAX) {
        bpf_probe_read_user(e->excluded, sizeof(e->excluded), (void *)c->c);
    } else if (c->c && c->i > 0) {
        u64 n = (u64)c->i;
        asm volatile("%0 &= 63" : "+r"(n));  /* a bound the verifier sees (clang drops the one above) */
        bpf_probe_read_user(e->excluded, n * sizeof(s32), (void *)c->c);
    }
    ctls.delete(&id);
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}

int nccl_destroy_enter(struct pt_regs *ctx)
{
    return nccl_ctl_enter(NCCL_CTL_END, NCCL_END_DESTROY, PT_REGS_PARM1(ctx), 0, 0, 0);
}

int nccl_abort_enter(struct pt_regs *ctx)
{
    return nccl_ctl_enter(NCCL_CTL_END, NCCL_END_ABORT, PT_REGS_PARM1(ctx), 0, 0, 0);
}

int nccl_end_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_ctl_call *c = nccl_ctl_take(id, NCCL_CTL_END);
    if (!c)
        return 0;
    s32 rc = (s32)PT_REGS_RC(ctx);
    nccl_comm_state_of(id, c->a);  /* a child never used before its end: its pending slot freed */
    if (rc == 0)
        nccl_comm_forget(id >> 32, c->a);
    struct nccl_comm_end *e = events.ringbuf_reserve(sizeof(struct nccl_comm_end));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
    } else {
        __builtin_memset(e, 0, sizeof(*e));
        e->type = NCCL_EV_COMM_END;
        e->kind = c->kind;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->rc = rc;
        e->ts_start = c->ts;
        e->ts_end = now;
        e->comm = c->a;
        events.ringbuf_submit(e, oe_wakeup_flags());
    }
    ctls.delete(&id);
    return 0;
}

/* (const ncclComm_t comm, int* out) */
int nccl_count_enter(struct pt_regs *ctx)
{
    return nccl_ctl_enter(NCCL_CTL_INFO, NCCL_INFO_COUNT, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0, 0);
}

int nccl_user_rank_enter(struct pt_regs *ctx)
{
    return nccl_ctl_enter(NCCL_CTL_INFO, NCCL_INFO_USER_RANK, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0, 0);
}

int nccl_cu_device_enter(struct pt_regs *ctx)
{
    return nccl_ctl_enter(NCCL_CTL_INFO, NCCL_INFO_CU_DEVICE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0, 0);
}

int nccl_info_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_ctl_call *c = nccl_ctl_take(id, NCCL_CTL_INFO);
    if (!c)
        return 0;
    s32 rc = (s32)PT_REGS_RC(ctx);
    struct nccl_comm_info *e = events.ringbuf_reserve(sizeof(struct nccl_comm_info));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
    } else {
        __builtin_memset(e, 0, sizeof(*e));
        e->type = NCCL_EV_COMM_INFO;
        e->kind = c->kind;
        e->pid = id >> 32;
        e->tid = (u32)id;
        e->rc = rc;
        if (rc == 0 && c->b)
            bpf_probe_read_user(&e->value, sizeof(e->value), (void *)c->b);
        e->ts = bpf_ktime_get_ns();
        e->comm = c->a;
        events.ringbuf_submit(e, oe_wakeup_flags());
    }
    ctls.delete(&id);
    return 0;
}

/* (ncclComm_t* comms, int ndev, const int* devlist) */
int nccl_init_all_enter(struct pt_regs *ctx)
{
    return nccl_ctl_enter(NCCL_CTL_INIT_ALL, 0, PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx),
                          (s32)PT_REGS_PARM2(ctx), 0);
}

int nccl_init_all_return(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_ctl_call *c = nccl_ctl_take(id, NCCL_CTL_INIT_ALL);
    if (!c)
        return 0;
    s32 rc = (s32)PT_REGS_RC(ctx);
    u64 comms_addr = c->a, devs_addr = c->b;
    s32 ndev = c->i;
    struct nccl_comm_init_all *e = events.ringbuf_reserve(sizeof(struct nccl_comm_init_all));
    if (!e) {
        oe_drop(OE_DROP_RINGBUF);
        ctls.delete(&id);
        return 0;
    }
    __builtin_memset(e, 0, sizeof(*e));
    e->type = NCCL_EV_COMM_INIT_ALL;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->rc = rc;
    e->ndev = ndev;
    e->ts_start = c->ts;
    e->ts_end = now;
    ctls.delete(&id);
    for (u32 i = 0; i < NCCL_INIT_ALL_MAX; i++) {
        if ((s32)i >= ndev)
            break;
        /* clang turns the loop test into i != min(ndev, MAX), which the verifier cannot bound;
         * an opaque mask gives the index a bound it can see (NCCL_INIT_ALL_MAX is 2^n). */
        u64 k = i;
        asm volatile("%0 &= 31" : "+r"(k));
        e->devs[k] = (s32)k;
        if (devs_addr)
            bpf_probe_read_user(&e->devs[k], sizeof(s32), (void *)(devs_addr + 4 * k));
        if (nccl_issued(rc)) {
            e->comms[k] = nccl_read_u64(comms_addr + 8 * k);
            nccl_comm_new(id >> 32, e->comms[k]);
        }
    }
    events.ringbuf_submit(e, oe_wakeup_flags());
    return 0;
}
