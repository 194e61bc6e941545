/* Maps of the block IO program (blockio.bpf.c). Nothing crosses the ring buffer per IO: the
 * program aggregates in the kernel and otel_ebpf/receivers/blockio/receiver.py reads these maps every
 * ``interval``. Each struct has exactly one Python mirror in otel_ebpf/receivers/blockio/receiver.py
 * (checked against gcc by tests/unit/test_blockio_layout.py). Record types of this receiver,
 * should it ever need ring-buffer records, are 64-79.
 */
#ifndef OE_BLOCKIO_H
#define OE_BLOCKIO_H

#define BLK_SLOTS 32       /* log2 latency buckets in microseconds: slot s holds [2^(s-1), 2^s) us */

/* Operation, from the tracepoint's rwbs string ("WS", "R", "FWS", "D"...). */
#define BLK_OP_READ 0
#define BLK_OP_WRITE 1
#define BLK_OP_DISCARD 2
#define BLK_OP_FLUSH 3
#define BLK_OP_OTHER 4

/* blk_misc[] indexes */
#define BLK_MISC_NO_ISSUE 0   /* completions whose issue was not seen (before start, or evicted) */
#define BLK_MISC_DEV_FULL 1   /* completions not counted: blk_dev_stats full */
#define BLK_MISC_PROC_FULL 2  /* completions of traced processes not attributed: blk_proc_stats full */
#define BLK_MISC_REQ_FULL 3   /* issues not tracked: blk_reqs update failed */
#define BLK_MISC_FLUSH 4      /* data-less completions of the flush machinery: not timed (see blockio.bpf.c) */
#define BLK_MISC_SLOTS 5

/* One request in flight, keyed by where it goes. */
struct blk_req_key {
    u32 dev;           /* kernel dev_t: major << 20 | minor */
    u32 _pad;
    u64 sector;
};

struct blk_req_val {
    u64 issue_ns;      /* 0 until block_rq_issue */
    u32 tgid;          /* the process that allocated the request (block_getrq), else inserted or issued it */
    u8 traced;         /* tgid was traced then */
    u8 _pad[3];
};

struct blk_dev_key {
    u32 dev;
    u32 op;            /* BLK_OP_* */
};

/* Per (device, op), per CPU, cumulative since the program loaded. */
struct blk_dev_val {
    u64 ops;
    u64 bytes;
    u64 ns;            /* sum of issue -> complete time */
    u64 slots[BLK_SLOTS];
};

struct blk_proc_key {
    u32 tgid;
    u32 dev;
    u32 op;
    u32 _pad;
};

/* Per (traced process, device, op), per CPU, cumulative. */
struct blk_proc_val {
    u64 ops;
    u64 bytes;
    u64 ns;
};

#endif /* OE_BLOCKIO_H */
