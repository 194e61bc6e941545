/* Collects every otel_ebpf_nccl probe hit (probes.h) as one perf event, for test_probes_bpf.py and the benchmark:
 * the probe's scalar arguments in a..d, its record copied (bpf_probe_read_user, as the receiver does) and its
 * fields read by name, the thread. Loaded with -I<otel_ebpf/nccl_profiler>. */
#include <uapi/linux/ptrace.h>
#include "probes.h"

enum { COMM_INIT = 1, COMM_FINALIZE, GROUP_START, API_START, COLL_START, P2P_START, KCH_START, KCH_STOP, EVENT_STOP };

/* Flat, so that BCC can build the Python class itself: a record's fields by name in f[] and s0..s3 (the
 * order is the test's), read out of probes.h's structs. */
struct ev {
    u32 probe;
    u32 tid;
    u64 a, b, c, d;
    u64 f[10];
    char s0[OE_NCCL_STR];
    char s1[OE_NCCL_STR];
    char s2[OE_NCCL_STR];
    char s3[OE_NCCL_STR];
    char name[64];
};

struct recs {
    struct oe_nccl_comm_rec comm;
    struct oe_nccl_coll_rec coll;
    struct oe_nccl_p2p_rec p2p;
};

BPF_PERF_OUTPUT(events);
BPF_PERCPU_ARRAY(scratch, struct ev, 1);
BPF_PERCPU_ARRAY(recbuf, struct recs, 1);
BPF_ARRAY(hits, u64, 1); /* every probe hit, also when the perf buffer is full */

static __always_inline struct ev *fresh(u32 probe)
{
    u32 zero = 0;
    u64 *n = hits.lookup(&zero);
    if (n)
        __sync_fetch_and_add(n, 1);
    struct ev *e = scratch.lookup(&zero);
    if (!e)
        return 0;
    __builtin_memset(e, 0, sizeof(*e));
    e->probe = probe;
    e->tid = (u32)bpf_get_current_pid_tgid();
    return e;
}

/* BCC rewrites bpf_usdt_readarg per attached function and not inside macros: one function per probe. */
static __always_inline int submit(struct pt_regs *ctx, struct ev *e)
{
#ifndef BENCH_NO_OUTPUT /* bench/nccl_profiler.py: the probe hits without the perf buffer */
    events.perf_submit(ctx, e, sizeof(*e));
#endif
    return 0;
}

int on_comm_init(struct pt_regs *ctx)
{
    struct ev *e = fresh(COMM_INIT);
    u32 zero = 0;
    struct recs *r = recbuf.lookup(&zero);
    u64 rec = 0;
    if (!e || !r)
        return 0;
    bpf_usdt_readarg(1, ctx, &e->a);
    bpf_usdt_readarg(2, ctx, &rec);
    bpf_probe_read_user(&r->comm, sizeof(r->comm), (void *)rec);
    e->f[0] = r->comm.comm_hash;
    e->f[1] = r->comm.rank;
    e->f[2] = r->comm.nranks;
    e->f[3] = r->comm.nnodes;
    e->f[4] = r->comm.version;
    __builtin_memcpy(e->name, r->comm.name, sizeof(e->name));
    return submit(ctx, e);
}

int on_comm_finalize(struct pt_regs *ctx)
{
    struct ev *e = fresh(COMM_FINALIZE);
    if (!e)
        return 0;
    bpf_usdt_readarg(1, ctx, &e->a);
    return submit(ctx, e);
}

int on_group_start(struct pt_regs *ctx)
{
    struct ev *e = fresh(GROUP_START);
    if (!e)
        return 0;
    bpf_usdt_readarg(1, ctx, &e->a);
    bpf_usdt_readarg(2, ctx, &e->b);
    return submit(ctx, e);
}

int on_api_start(struct pt_regs *ctx)
{
    struct ev *e = fresh(API_START);
    if (!e)
        return 0;
    bpf_usdt_readarg(1, ctx, &e->a);
    bpf_usdt_readarg(2, ctx, &e->b);
    return submit(ctx, e);
}

int on_coll_start(struct pt_regs *ctx)
{
    struct ev *e = fresh(COLL_START);
    u32 zero = 0;
    struct recs *r = recbuf.lookup(&zero);
    u64 rec = 0;
    if (!e || !r)
        return 0;
    bpf_usdt_readarg(1, ctx, &e->a);
    bpf_usdt_readarg(2, ctx, &rec);
    bpf_probe_read_user(&r->coll, sizeof(r->coll), (void *)rec);
    e->f[0] = r->coll.context;
    e->f[1] = r->coll.parent;
    e->f[2] = r->coll.seq;
    e->f[3] = r->coll.count;
    e->f[4] = r->coll.send_buff;
    e->f[5] = r->coll.recv_buff;
    e->f[6] = r->coll.root;
    e->f[7] = r->coll.nchannels;
    e->f[8] = r->coll.nwarps;
    e->f[9] = r->coll.api;
    __builtin_memcpy(e->s0, r->coll.func, OE_NCCL_STR);
    __builtin_memcpy(e->s1, r->coll.datatype, OE_NCCL_STR);
    __builtin_memcpy(e->s2, r->coll.algo, OE_NCCL_STR);
    __builtin_memcpy(e->s3, r->coll.proto, OE_NCCL_STR);
    return submit(ctx, e);
}

int on_p2p_start(struct pt_regs *ctx)
{
    struct ev *e = fresh(P2P_START);
    u32 zero = 0;
    struct recs *r = recbuf.lookup(&zero);
    u64 rec = 0;
    if (!e || !r)
        return 0;
    bpf_usdt_readarg(1, ctx, &e->a);
    bpf_usdt_readarg(2, ctx, &rec);
    bpf_probe_read_user(&r->p2p, sizeof(r->p2p), (void *)rec);
    e->f[0] = r->p2p.context;
    e->f[1] = r->p2p.parent;
    e->f[2] = r->p2p.count;
    e->f[3] = r->p2p.buff;
    e->f[4] = (u64)(s64)r->p2p.peer;
    e->f[5] = r->p2p.nchannels;
    e->f[6] = r->p2p.api;
    __builtin_memcpy(e->s0, r->p2p.func, OE_NCCL_STR);
    __builtin_memcpy(e->s1, r->p2p.datatype, OE_NCCL_STR);
    return submit(ctx, e);
}

int on_kernel_ch_start(struct pt_regs *ctx)
{
    struct ev *e = fresh(KCH_START);
    u32 channel = 0; /* a 4-byte argument: BCC's reader refuses a destination of another size */
    if (!e)
        return 0;
    bpf_usdt_readarg(1, ctx, &e->a);
    bpf_usdt_readarg(2, ctx, &e->b);
    bpf_usdt_readarg(3, ctx, &channel);
    bpf_usdt_readarg(4, ctx, &e->d);
    e->c = channel;
    return submit(ctx, e);
}

int on_kernel_ch_stop(struct pt_regs *ctx)
{
    struct ev *e = fresh(KCH_STOP);
    if (!e)
        return 0;
    bpf_usdt_readarg(1, ctx, &e->a);
    bpf_usdt_readarg(2, ctx, &e->b);
    return submit(ctx, e);
}

int on_event_stop(struct pt_regs *ctx)
{
    struct ev *e = fresh(EVENT_STOP);
    if (!e)
        return 0;
    bpf_usdt_readarg(1, ctx, &e->a);
    bpf_usdt_readarg(2, ctx, &e->b);
    return submit(ctx, e);
}
