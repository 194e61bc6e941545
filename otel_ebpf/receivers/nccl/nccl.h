/* Records the NCCL receiver's BPF program (nccl.bpf.c) writes to the ring buffer "events".
 *
 * Each struct starts with a u8 type (>= 32: common.bpf.c uses 1..2, the CUDA receiver 16..31),
 * is zeroed before it is filled, and has exactly one Python mirror in receiver.py
 * (tests/unit/test_nccl_layout.py compiles this file with gcc and checks sizes and offsets).
 * Padding is explicit so the layout is the same for clang -target bpf and gcc x86-64.
 * Only u8/u32/s32/u64 are used, so this header compiles in BPF and in user space alike.
 *
 * Times are bpf_ktime_get_ns() (CLOCK_MONOTONIC); Python converts them to epoch ns.
 * Communicator handles (ncclComm_t) are user-space addresses, meaningful per process only.
 */
#ifndef OE_NCCL_H
#define OE_NCCL_H

#include "../../nccl_profiler/probes.h"

#define NCCL_EV_COMM_INIT 32      /* ncclCommInitRank / ...Config / ...Scalable returned */
#define NCCL_EV_COMM_INIT_ALL 33  /* ncclCommInitAll returned */
#define NCCL_EV_COMM_SPLIT 34     /* ncclCommSplit returned */
#define NCCL_EV_COMM_END 35       /* ncclCommDestroy / ncclCommAbort returned */
#define NCCL_EV_COMM_INFO 36      /* ncclCommCount / ncclCommUserRank / ncclCommCuDevice returned */
#define NCCL_EV_COLL 37           /* a collective returned (host enqueue done) */
#define NCCL_EV_P2P 38            /* ncclSend / ncclRecv returned */
#define NCCL_EV_GROUP 39          /* the outermost ncclGroupEnd / ncclGroupSimulateEnd returned */
#define NCCL_EV_COMM_SHRINK 40    /* ncclCommShrink returned */
#define NCCL_EV_COMM_BIND 41      /* a non-blocking split/shrink child's handle, first seen on a call */

#define NCCL_UNIQUE_ID_BYTES 128  /* sizeof(ncclUniqueId), NCCL 2.x */
#define NCCL_INIT_ALL_MAX 32      /* communicators of one ncclCommInitAll recorded (ndev beyond: cut) */
#define NCCL_SHRINK_MAX 64        /* excluded ranks of one ncclCommShrink recorded (beyond: cut) */

/* nccl_coll.op / nccl_p2p.op, named in receiver.py OPS */
#define NCCL_OP_ALL_REDUCE 0
#define NCCL_OP_BROADCAST 1
#define NCCL_OP_REDUCE 2
#define NCCL_OP_ALL_GATHER 3
#define NCCL_OP_REDUCE_SCATTER 4
#define NCCL_OP_ALL_TO_ALL 5
#define NCCL_OP_GATHER 6
#define NCCL_OP_SCATTER 7
#define NCCL_OP_SEND 8
#define NCCL_OP_RECV 9

/* nccl_comm_init.kind */
#define NCCL_INIT_RANK 0
#define NCCL_INIT_RANK_CONFIG 1
#define NCCL_INIT_RANK_SCALABLE 2

/* nccl_comm_end.kind */
#define NCCL_END_DESTROY 0
#define NCCL_END_ABORT 1

/* nccl_comm_info.kind */
#define NCCL_INFO_COUNT 0
#define NCCL_INFO_USER_RANK 1
#define NCCL_INFO_CU_DEVICE 2

/* flags */
#define NCCL_F_SEQ 1  /* seq is valid: the communicator's creation was seen and the call was issued */
#define NCCL_F_CAPTURED 2  /* made during a CUDA stream capture of its thread: recorded into a graph, not run */
#define NCCL_GROUP_F_SIMULATED 1  /* nccl_group.flags: closed by ncclGroupSimulateEnd, nothing launched */
#define NCCL_GROUP_F_CAPTURED 2   /* nccl_group.flags: closed during a stream capture (as NCCL_F_CAPTURED) */

struct nccl_comm_init {
    u8 type;
    u8 kind;
    u8 _pad[2];
    u32 pid;
    u32 tid;
    s32 rc;
    s32 nranks;
    s32 rank;
    u64 ts_start;
    u64 ts_end;
    u64 comm;                     /* *comm after the call (0 when unreadable) */
    u8 id[NCCL_UNIQUE_ID_BYTES];  /* the ncclUniqueId, read at entry */
};

struct nccl_comm_init_all {
    u8 type;
    u8 _pad[3];
    u32 pid;
    u32 tid;
    s32 rc;
    s32 ndev;
    u32 _pad2;
    u64 ts_start;
    u64 ts_end;
    u64 comms[NCCL_INIT_ALL_MAX];
    s32 devs[NCCL_INIT_ALL_MAX];  /* devlist[i], or i when devlist is NULL */
};

struct nccl_comm_split {
    u8 type;
    u8 _pad[3];
    u32 pid;
    u32 tid;
    s32 rc;
    s32 color;
    s32 key;
    u64 ts_start;
    u64 ts_end;
    u64 parent;
    u64 comm;     /* *newcomm after the call: 0 for NCCL_SPLIT_NOCOLOR, or non-blocking until published */
    u64 newcomm;  /* newcomm itself: the address the child's handle is published at */
};

struct nccl_comm_shrink {
    u8 type;
    u8 _pad[3];
    u32 pid;
    u32 tid;
    s32 rc;
    s32 nexcluded;  /* excludeRanksCount as passed; excluded[] holds the first NCCL_SHRINK_MAX */
    s32 flags;      /* shrinkFlags */
    u64 ts_start;
    u64 ts_end;
    u64 parent;
    u64 comm;       /* *newcomm after the call: 0 while a non-blocking shrink is in progress */
    u64 newcomm;    /* newcomm itself (as in nccl_comm_split) */
    s32 excluded[NCCL_SHRINK_MAX];
};

/* The first probed call on a handle published at a pending newcomm address (nccl.bpf.c): comm is the
 * child of the split/shrink record with that newcomm. Submitted before that call's own record. */
struct nccl_comm_bind {
    u8 type;
    u8 _pad[3];
    u32 pid;
    u32 tid;
    u32 _pad2;
    u64 ts;
    u64 comm;
    u64 newcomm;
};

struct nccl_comm_end {
    u8 type;
    u8 kind;
    u8 _pad[2];
    u32 pid;
    u32 tid;
    s32 rc;
    u64 ts_start;
    u64 ts_end;
    u64 comm;
};

struct nccl_comm_info {
    u8 type;
    u8 kind;
    u8 _pad[2];
    u32 pid;
    u32 tid;
    s32 rc;
    s32 value;  /* *count / *rank / *device; valid when rc == 0 */
    u32 _pad2;
    u64 ts;
    u64 comm;
};

struct nccl_coll {
    u8 type;
    u8 op;
    u8 flags;
    u8 _pad;
    u32 pid;
    u32 tid;
    s32 rc;
    s32 datatype;
    s32 redop;   /* -1 for ops without one */
    s32 root;    /* -1 for ops without one */
    u32 _pad2;
    u64 ts_start;
    u64 ts_end;
    u64 count;
    u64 comm;
    u64 stream;
    u64 seq;     /* per (process, communicator) collective number, from 0 */
    u64 group;   /* the enclosing group's id, 0 outside a group */
    u64 api;     /* the NCCL profiler plugin's CollApi handle started inside this call, 0: none (nccl_prof.bpf.c) */
};

struct nccl_p2p {
    u8 type;
    u8 op;
    u8 flags;
    u8 _pad;
    u32 pid;
    u32 tid;
    s32 rc;
    s32 datatype;
    s32 peer;
    u64 ts_start;
    u64 ts_end;
    u64 count;
    u64 comm;
    u64 stream;
    u64 seq;     /* per (process, communicator, peer, direction) number, from 0 */
    u64 group;
    u64 api;     /* the plugin's P2pApi handle started inside this call, 0: none */
};

struct nccl_group {
    u8 type;
    u8 flags;     /* NCCL_GROUP_F_* */
    u8 _pad[2];
    u32 pid;
    u32 tid;
    s32 rc;
    u32 members;  /* collectives and p2p calls issued inside, nested groups included */
    u32 p2p;      /* of which ncclSend / ncclRecv */
    u64 ts_start; /* outermost ncclGroupStart entry */
    u64 ts_end;   /* outermost ncclGroupEnd return */
    u64 group;
};

/* ---- records from otel-ebpf's NCCL profiler plugin (USDT otel_ebpf_nccl:*, nccl_prof.bpf.c) ---- */

#define NCCL_EV_PROF_COMM 42      /* comm_init: the plugin's context for a communicator */
#define NCCL_EV_PROF_COMM_END 43  /* comm_finalize */
#define NCCL_EV_PROF_OP 44        /* every kernel channel of a planned collective/p2p stopped: the op, its GPU time */
#define NCCL_PROF_KIND_COLL 0     /* nccl_prof_op.kind: rec.coll (coll_start) */
#define NCCL_PROF_KIND_P2P 1      /* rec.p2p (p2p_start) */
#define NCCL_PROF_REC_BYTES 160  /* sizeof(struct oe_nccl_coll_rec): a number, as BCC's map descriptions need */
_Static_assert(sizeof(struct oe_nccl_coll_rec) == NCCL_PROF_REC_BYTES, "nccl_prof_op.rec holds an oe_nccl_coll_rec");
_Static_assert(sizeof(struct oe_nccl_p2p_rec) <= NCCL_PROF_REC_BYTES, "nccl_prof_op.rec holds an oe_nccl_p2p_rec");

struct nccl_prof_comm {
    u8 type;
    u8 _pad[3];
    u32 pid;
    u32 tid;
    u32 _pad2;
    u64 ts;
    u64 context;
    struct oe_nccl_comm_rec rec;
};

struct nccl_prof_comm_end {
    u8 type;
    u8 _pad[3];
    u32 pid;
    u32 tid;
    u32 _pad2;
    u64 ts;
    u64 context;
};

/* One collective or p2p as NCCL planned it (coll_start / p2p_start) with its GPU time, sent once its last
 * kernel channel stopped (nccl_prof.bpf.c keeps it in prof_ops until then). */
struct nccl_prof_op {
    u8 type;
    u8 kind;       /* NCCL_PROF_KIND_* */
    u8 _pad[2];
    u32 pid;
    u32 tid;       /* the thread that planned it */
    u32 channels;  /* kernel channels that stopped */
    u64 ts;        /* host time of coll_start / p2p_start */
    u64 handle;    /* the plugin's handle of the Coll/P2p event */
    u64 gpu_start; /* first channel start, GPU %globaltimer ns (pTimer) */
    u64 gpu_stop;  /* last channel stop */
    u8 rec[NCCL_PROF_REC_BYTES]; /* kind COLL: an oe_nccl_coll_rec; P2P: an oe_nccl_p2p_rec (smaller) */
};

#endif /* OE_NCCL_H */
