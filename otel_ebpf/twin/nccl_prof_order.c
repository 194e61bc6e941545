/*
 * Stand-in libnccl.so.2 for the twin, part 8: the order NCCL 2.28.9's planner gives a kernel plan's tasks, and what
 * the twin's tuner picks for them, for the profiler's Coll and P2p events (nccl_prof_plan.c).  Not NVIDIA's code.
 *
 * Order (src/enqueue.cc): collectives first as ncclTaskCollSorter leaves them (size bins descending, last-in first
 * within a bin), then as ncclPrepareTasks bins them by (function, device op, type) in first-seen order, last-in
 * first within each (so one kind of collective comes size-ascending); then sends and recvs round by round of the p2p
 * schedule (round r: send to rank + r, recv from rank - r, as src/init.cc ncclP2pSchedule orders the peers of one
 * node), one of each per peer and round, until none is left (scheduleP2pTasksToPlan).
 *
 * Tuning: NCCL's tuner would weigh the topology; the twin's picks are its own, plausible for two GPUs on one PCIe
 * switch (TWIN_NCHANNELS): collectives RING (NCCL's choice within a node for two ranks), LL below 64 KiB and SIMPLE
 * above; channels and warps by topoGetAlgoInfo's ring rule (shed channels, then threads, while nBytes < nc * nt *
 * threshold; SIMPLE's extra warp) and the channel split of scheduleCollTasksToPlan (16 KiB of traffic at least per
 * channel), from channel 0; p2p by addP2pToPlan's part sizes (a 128 KiB step, PCIe's P2P chunk) on the channels of
 * its round (ncclP2pChannelBaseForRound within a node).
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "nccl_prof.h"

static size_t div_up(size_t a, size_t b) { return (a + b - 1) / b; }

/* src/enqueue.cc ncclFuncTrafficPerByte */
static size_t traffic_per_byte(int func, int nranks)
{
    return func == TWIN_F_ALLREDUCE ? 2 : func == TWIN_F_ALLGATHER || func == TWIN_F_REDUCESCATTER ? (size_t)nranks : 1;
}

/* src/include/bitops.h u32fpEncode */
static uint32_t fp_encode(uint32_t x, int bits)
{
    int log2x = 31 - __builtin_clz(x | 1);
    uint32_t mantissa = x >> (log2x >= bits ? log2x - bits : 0) & ((1u << bits) - 1);
    uint32_t exponent = log2x >= bits ? (uint32_t)(log2x - (bits - 1)) : 0;
    return exponent << bits | mantissa;
}

/* ncclTaskCollSorterInsert's bin (UnitLog2 10, MaxLog2 30, 4 bins per power of 2), descending. */
static int coll_bin(const struct prof_op *o)
{
    size_t traffic = o->count * twin_type_size(o->type) * traffic_per_byte(o->func, o->comm->nranks);
    size_t max = (size_t)1 << 30;
    return 1 + (30 - 10) * 4 - 1 - (int)fp_encode((uint32_t)((traffic < max ? traffic : max) >> 10), 2);
}

/* ncclPrepareTasks' (fn, op, ty) key; the device op as hostToDevRedOp maps it (max and min: MinMax; avg: SumPostDiv
 * for integers, PreMulSum for floats; ncclRedOpCreatePreMulSum's: PreMulSum). */
static int coll_key(const struct prof_op *o)
{
    int integral = o->type != ncclFloat16 && o->type != ncclBfloat16 && o->type != ncclFloat32 && o->type != ncclFloat64
                   && o->type != ncclFloat8e4m3 && o->type != ncclFloat8e5m2;
    int dev = o->op == ncclSum ? 0 : o->op == ncclProd ? 1 : o->op == ncclMax || o->op == ncclMin ? 2
            : o->op == ncclAvg ? (integral ? 4 : 3) : 3;
    return (o->func * 5 + dev) * 64 + (int)o->type;
}

/* in[0..k) (append order) -> out, the planner's order of collectives. */
void twin_prof_order_colls(const struct prof_op *ops, const int *in, int k, int *out, int *scratch)
{
    int m = 0;
    for (int i = 0; i < k; i++) { /* the sorter: bin ascending, later first within a bin */
        int j = i, v = in[i], b = coll_bin(&ops[v]);
        for (; j > 0 && coll_bin(&ops[scratch[j - 1]]) >= b; j--)
            scratch[j] = scratch[j - 1];
        scratch[j] = v;
    }
    for (int i = 0; i < k; i++) { /* (fn, op, ty) groups in first-seen order, each reversed */
        int key, first = m;
        if (scratch[i] < 0)
            continue;
        key = coll_key(&ops[scratch[i]]);
        for (int j = i; j < k; j++)
            if (scratch[j] >= 0 && coll_key(&ops[scratch[j]]) == key) {
                out[m++] = scratch[j];
                scratch[j] = -1;
            }
        for (int a = first, b = m - 1; a < b; a++, b--) {
            int t = out[a];
            out[a] = out[b];
            out[b] = t;
        }
    }
}

static int first_of(const struct prof_op *ops, int *in, int k, int func, int peer)
{
    for (int i = 0; i < k; i++)
        if (in[i] >= 0 && ops[in[i]].func == func && ops[in[i]].peer == peer) {
            int v = in[i];
            in[i] = -1;
            return v;
        }
    return -1;
}

/* scheduleP2pTasksToPlan: round by round, the next send to rank + r, then the next recv from rank - r. */
void twin_prof_order_p2p(const struct prof_op *ops, int *in, int k, int *out, int rank, int nranks)
{
    for (int m = 0; m < k;)
        for (int r = 0; r < nranks && m < k; r++) {
            int s = first_of(ops, in, k, TWIN_F_SEND, (rank + r) % nranks);
            int v = first_of(ops, in, k, TWIN_F_RECV, (rank - r + nranks) % nranks);
            if (s >= 0)
                out[m++] = s;
            if (v >= 0)
                out[m++] = v;
        }
}

void twin_prof_tune_coll(struct prof_op *o)
{
    size_t nbytes = o->count * twin_type_size(o->type)
                    * (o->func == TWIN_F_ALLGATHER || o->func == TWIN_F_REDUCESCATTER ? (size_t)o->comm->nranks : 1);
    int ll = nbytes < (64 << 10), threshold = ll ? 8 : 64, nt = 512, nc = TWIN_NCHANNELS;
    size_t traffic = nbytes * (o->func == TWIN_F_ALLREDUCE ? 2 : 1) * (ll ? 4 : 1), per, n;
    while (nbytes < (size_t)nc * nt * threshold && nc >= 2)
        nc--;
    while (nbytes < (size_t)nc * nt * threshold && nt % 128 == 0)
        nt /= 2;
    nt += ll ? 0 : 32;
    nt = nt / 32 < 3 ? 96 : nt;
    per = traffic / (size_t)nc > (16 << 10) ? traffic / (size_t)nc : (16 << 10);
    n = div_up(traffic, per);
    o->nch = (uint8_t)(n < 1 ? 1 : n < (size_t)nc ? n : (size_t)nc);
    o->nwarps = (uint8_t)(nt / 32);
    o->algo = "RING";
    o->proto = ll ? "LL" : "SIMPLE";
    o->chan0 = 0;
}

void twin_prof_tune_p2p(struct prof_op *o)
{
    struct ncclComm *c = o->comm;
    size_t bytes = o->count * twin_type_size(o->type), step = 128 << 10;
    size_t min_part = c->prof.nnodes > 1 ? step / 2 : step / 8, max_part = c->prof.nnodes > 1 ? step : step * 32, part;
    int nmin = TWIN_NCHANNELS, nmax = TWIN_NCHANNELS, n = 1;
    int round = o->func == TWIN_F_SEND ? (o->peer - c->rank + c->nranks) % c->nranks
                                       : (c->rank - o->peer + c->nranks) % c->nranks;
    while (nmin * c->nranks > TWIN_NCHANNELS && nmin > 1)
        nmin /= 2;
    if (bytes > 0) {
        n = div_up(bytes, min_part) < (size_t)nmin ? (int)div_up(bytes, min_part) : nmin;
        part = div_up(bytes, (size_t)n) > min_part ? div_up(bytes, (size_t)n) : min_part;
        while (part > max_part && n <= nmax / 2) {
            n *= 2;
            part = div_up(bytes, (size_t)n);
        }
    }
    o->nch = (uint8_t)n;
    /* ncclP2pChannelBaseForRound within a node: reverseBits(round, log2Up(p2pnChannels)) */
    o->chan0 = (uint8_t)(TWIN_NCHANNELS == 2 ? (round & 1) : 0);
}
