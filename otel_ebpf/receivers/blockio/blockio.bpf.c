/* Block IO: per-device latency histograms and per-process bytes/latency, aggregated in the
 * kernel (structs in blockio.h). Tracepoints only (block:block_getrq, block_bio_frontmerge,
 * block_rq_insert, block_rq_issue, block_rq_complete; their args are read from tracefs by BCC, so
 * no kernel struct layout is assumed).
 *
 * Attribution: completions run in interrupt context, so the process a request belongs to is
 * remembered per request, keyed by (dev, sector). It is recorded at block_getrq: the request is
 * allocated in blk_mq_submit_bio, always in the submitting task (block/blk-mq.c, Linux 6.x). The
 * later tracepoints may run elsewhere: a data write with REQ_PREFLUSH on a disk with a write cache
 * goes through the flush state machine (block/blk-flush.c) and is inserted and issued by kblockd
 * (ext4 fast commits, jbd2 commit blocks); a request that finds the driver out of budget or tags
 * while a plug is flushed goes to hctx->dispatch by blk_mq_request_bypass_insert, which has no
 * tracepoint, and is issued from kblockd too. Keyed at insert or issue, such requests were counted
 * for the kworker. A bio merged in front of a request moves its start (block_bio_frontmerge: the
 * old start is the bio's end), so the entry moves with it. block_rq_insert still records for
 * requests allocated without a bio (none carry data today); the first record of a request wins.
 * Requests that never complete (merged away) age out of the LRU map; a completion whose issue was
 * not seen is counted in blk_misc[BLK_MISC_NO_ISSUE]. A bio merged into the back of another
 * process's request is counted for that request's process (the kernel keeps no per-bio owner).
 *
 * Flushes are not timed: the flush machinery (block/blk-flush.c) issues a separate flush request
 * whose completion has no tracepoint, completes a data-less flush ("FF") without issuing it, and
 * completes a write with a post-flush (O_SYNC on a disk with a write cache) a second time, with
 * 0 bytes, after its data was counted. Such data-less completions without an issue are only
 * counted (blk_misc[BLK_MISC_FLUSH]), and the flush request's issue is not stored, so it cannot
 * take a slot in blk_reqs until evicted.
 */
#include "blockio.h"

#ifndef BLK_MAX_INFLIGHT
#define BLK_MAX_INFLIGHT 16384
#endif
#ifndef BLK_MAX_DEV_KEYS
#define BLK_MAX_DEV_KEYS 1024
#endif
#ifndef BLK_MAX_PROC_KEYS
#define BLK_MAX_PROC_KEYS 8192
#endif

BPF_TABLE("lru_hash", struct blk_req_key, struct blk_req_val, blk_reqs, BLK_MAX_INFLIGHT);
BPF_PERCPU_HASH(blk_dev_stats, struct blk_dev_key, struct blk_dev_val, BLK_MAX_DEV_KEYS);
BPF_PERCPU_HASH(blk_proc_stats, struct blk_proc_key, struct blk_proc_val, BLK_MAX_PROC_KEYS);
BPF_ARRAY(blk_misc, u64, BLK_MISC_SLOTS);
BPF_PERCPU_ARRAY(blk_zero, struct blk_dev_val, 1); /* zeroed value to insert from (too big for the stack) */

static __always_inline void blk_count(int idx)
{
    u64 *v = blk_misc.lookup(&idx);
    if (v)
        __sync_fetch_and_add(v, 1);
}

/* rwbs (block/blk-core.c blk_fill_rwbs): an optional 'F' (preflush), then the op letter. */
static __always_inline u32 blk_op(const char *rwbs)
{
    char c = rwbs[0];
    if (c == 'F' && rwbs[1] != 0 && rwbs[1] != 'S' && rwbs[1] != 'M' && rwbs[1] != 'A')
        c = rwbs[1];
    if (c == 'R')
        return BLK_OP_READ;
    if (c == 'W')
        return BLK_OP_WRITE;
    if (c == 'D')
        return BLK_OP_DISCARD;
    if (c == 'F')
        return BLK_OP_FLUSH;
    return BLK_OP_OTHER;
}

/* Remember a traced submitter's request; ``only_new``: keep an entry that is already there. */
static __always_inline void blk_own(u32 dev, u64 sector, int only_new)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!oe_is_traced(tgid))
        return; /* untraced: block_rq_issue starts the clock, attribution is not needed */
    struct blk_req_key k = {};
    k.dev = dev;
    k.sector = sector;
    struct blk_req_val v = {};
    v.tgid = tgid;
    v.traced = 1;
    if (only_new) {
        blk_reqs.insert(&k, &v); /* fails when there: the earlier record wins */
        return;
    }
    if (blk_reqs.update(&k, &v) != 0)
        blk_count(BLK_MISC_REQ_FULL);
}

TRACEPOINT_PROBE(block, block_getrq)
{
    if (args->nr_sector == 0)
        return 0; /* a data-less flush: not timed, see above */
    blk_own(args->dev, args->sector, 0);
    return 0;
}

TRACEPOINT_PROBE(block, block_bio_frontmerge)
{
    struct blk_req_key old = {};
    old.dev = args->dev;
    old.sector = args->sector + args->nr_sector;
    struct blk_req_val *seen = blk_reqs.lookup(&old);
    if (!seen)
        return 0;
    struct blk_req_val v = *seen;
    blk_reqs.delete(&old);
    struct blk_req_key k = {};
    k.dev = args->dev;
    k.sector = args->sector;
    if (blk_reqs.update(&k, &v) != 0)
        blk_count(BLK_MISC_REQ_FULL);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_insert)
{
    if (args->nr_sector == 0 && blk_op(args->rwbs) == BLK_OP_FLUSH)
        return 0;
    blk_own(args->dev, args->sector, 1);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_issue)
{
    if (args->nr_sector == 0 && blk_op(args->rwbs) == BLK_OP_FLUSH)
        return 0;
    struct blk_req_key k = {};
    k.dev = args->dev;
    k.sector = args->sector;
    u64 now = bpf_ktime_get_ns();
    struct blk_req_val *seen = blk_reqs.lookup(&k);
    if (seen) { /* a traced process's (or requeued): keep who, restart the clock */
        seen->issue_ns = now;
        return 0;
    }
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct blk_req_val v = {};
    v.issue_ns = now;
    v.tgid = tgid;
    v.traced = oe_is_traced(tgid) ? 1 : 0;
    if (blk_reqs.update(&k, &v) != 0)
        blk_count(BLK_MISC_REQ_FULL);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
    struct blk_req_key k = {};
    k.dev = args->dev;
    k.sector = args->sector;
    struct blk_req_val *req = blk_reqs.lookup(&k);
    if (!req) {
        if (args->nr_sector == 0) /* the flush machinery's, see above */
            blk_count(BLK_MISC_FLUSH);
        else
            blk_count(BLK_MISC_NO_ISSUE);
        return 0;
    }
    u64 issued = req->issue_ns;
    u32 tgid = req->tgid;
    u8 traced = req->traced;
    blk_reqs.delete(&k);
    if (!issued) {
        blk_count(BLK_MISC_NO_ISSUE);
        return 0;
    }
    u64 ns = bpf_ktime_get_ns() - issued;
    u64 bytes = (u64)args->nr_sector << 9;
    u32 op = blk_op(args->rwbs);

    struct blk_dev_key dk = {};
    dk.dev = args->dev;
    dk.op = op;
    struct blk_dev_val *d = blk_dev_stats.lookup(&dk);
    if (!d) {
        int zero = 0;
        struct blk_dev_val *z = blk_zero.lookup(&zero);
        if (!z)
            return 0;
        if (blk_dev_stats.update(&dk, z) != 0) {
            blk_count(BLK_MISC_DEV_FULL);
        }
        d = blk_dev_stats.lookup(&dk);
    }
    if (d) {
        u64 slot = bpf_log2l(ns / 1000);
        if (slot >= BLK_SLOTS)
            slot = BLK_SLOTS - 1;
        d->ops += 1;
        d->bytes += bytes;
        d->ns += ns;
        d->slots[slot & (BLK_SLOTS - 1)] += 1;
    }
    if (!traced)
        return 0;
    struct blk_proc_key pk = {};
    pk.tgid = tgid;
    pk.dev = args->dev;
    pk.op = op;
    struct blk_proc_val *p = blk_proc_stats.lookup(&pk);
    if (!p) {
        struct blk_proc_val pv = {};
        if (blk_proc_stats.update(&pk, &pv) != 0)
            blk_count(BLK_MISC_PROC_FULL);
        p = blk_proc_stats.lookup(&pk);
    }
    if (p) {
        p->ops += 1;
        p->bytes += bytes;
        p->ns += ns;
    }
    return 0;
}
