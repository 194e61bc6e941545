/* Block IO: per-device latency histograms and per-process bytes/latency, aggregated in the
 * kernel (structs in blockio.h). Tracepoints only (block:block_rq_insert, block_rq_issue,
 * block_rq_complete; their args are read from tracefs by BCC, so no kernel struct layout is
 * assumed).
 *
 * Attribution: completions run in interrupt context, so the issuing process is remembered per
 * request, keyed by (dev, sector). block_rq_insert runs in the submitting task (a request
 * queued by the IO scheduler or a plug); block_rq_issue runs there too for a direct issue, but
 * in a kworker when the queue is run asynchronously: the first context seen wins. Requests that
 * never complete (merged away) age out of the LRU map; a completion whose issue was not seen is
 * counted in blk_misc[BLK_MISC_NO_ISSUE].
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

TRACEPOINT_PROBE(block, block_rq_insert)
{
    if (args->nr_sector == 0 && blk_op(args->rwbs) == BLK_OP_FLUSH)
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!oe_is_traced(tgid))
        return 0; /* untraced: block_rq_issue starts the clock, attribution is not needed */
    struct blk_req_key k = {};
    k.dev = args->dev;
    k.sector = args->sector;
    struct blk_req_val v = {};
    v.tgid = tgid;
    v.traced = 1;
    blk_reqs.update(&k, &v);
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
    if (seen) { /* inserted by a traced process (or requeued): keep who, restart the clock */
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
