/*
 * Stand-in libnccl.so.2 for the twin, part 2: data movement between the rank processes, through one
 * shared-memory staging area per communicator ($OTEL_EBPF_TWIN_DIR/comm-<hash>: a header page with a
 * process-shared barrier, then one slot per rank; nccl_shm.c).  Every collective: copy own input to own slot, barrier,
 * compute own output from all slots, barrier; larger buffers go in slot-sized chunks.  Each API call checks
 * its arguments, then hands the operation to nccl_group.c (run now, or at the outermost ncclGroupEnd).
 * "Device" buffers are host memory (cudart.c), so they are read and written directly.  Results are real:
 * an all-reduce sums the ranks' actual values, as NCCL's kernels would (semantics of each collective: nccl.h
 * 2.28.9 comments).
 *
 * The collectives run on the stream's worker thread after the call has returned (nccl_group.c group_run), so
 * a late rank shows as pending work on its peers' streams, as on a GPU.  A rank that dies leaves its peers'
 * work waiting until the communicator is aborted (then it stops, and ncclCommGetAsyncError says
 * ncclRemoteError); a dead rank on another node is noticed within ~100 ms as NCCL's network transport does
 * (twin_peer_check), one on the same node is not (NCCL's shared-memory transport does not either).
 *
 * Known differences from NCCL 2.28.9, not fixed yet (docs/twin.md lists them):
 * - Work takes host time: a collective's stream time is the time for every rank to arrive plus memcpy,
 *   with no model of link bandwidth or algorithms.
 * - Reductions compute in double, then round to the element type (NCCL reduces in the element type);
 *   fp8 types are reduced as bytes.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_twin.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- element access ---- */

size_t twin_type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static float half_to_float(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, f;
    float r;
    if (e == 0 && m == 0) {
        f = s;
    } else if (e == 0) { /* subnormal: normalise */
        e = 127 - 15 + 1;
        while (!(m & 0x400)) { m <<= 1; e--; }
        f = s | (e << 23) | ((m & 0x3ff) << 13);
    } else if (e == 31) {
        f = s | 0x7f800000 | (m << 13);
    } else {
        f = s | ((e + 127 - 15) << 23) | (m << 13);
    }
    memcpy(&r, &f, 4);
    return r;
}

static uint16_t float_to_half(float x)
{
    uint32_t f, s, m;
    int e;
    memcpy(&f, &x, 4);
    s = (f >> 16) & 0x8000;
    e = (int)((f >> 23) & 0xff) - 127 + 15;
    m = f & 0x7fffff;
    if (((f >> 23) & 0xff) == 0xff)
        return (uint16_t)(s | 0x7c00 | (m ? 0x200 : 0));
    if (e >= 31)
        return (uint16_t)(s | 0x7c00);
    if (e <= 0)
        return e < -10 ? (uint16_t)s : (uint16_t)(s | ((m | 0x800000) >> (14 - e)));
    return (uint16_t)(s | ((uint32_t)e << 10) | (m >> 13));
}

static float bf16_to_float(uint16_t b) { uint32_t f = (uint32_t)b << 16; float r; memcpy(&r, &f, 4); return r; }
static uint16_t float_to_bf16(float x) { uint32_t f; memcpy(&f, &x, 4); f += 0x7fff + ((f >> 16) & 1); return (uint16_t)(f >> 16); }

static double load(const void *p, size_t i, ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclUint64: return (double)((const uint64_t *)p)[i];
    case ncclFloat16: return half_to_float(((const uint16_t *)p)[i]);
    case ncclBfloat16: return bf16_to_float(((const uint16_t *)p)[i]);
    case ncclFloat32: return ((const float *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static void store(void *p, size_t i, ncclDataType_t t, double v)
{
    switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t *)p)[i] = float_to_half((float)v); break;
    case ncclBfloat16: ((uint16_t *)p)[i] = float_to_bf16((float)v); break;
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}

/* ---- reductions; custom ops are ncclRedOpCreatePreMulSum's: sum of (scalar * x) ---- */

#define MAX_CUSTOM_OPS 1024
static double premul_scalar[MAX_CUSTOM_OPS];
static int next_custom_op = ncclNumOps;

/* dst[i] = op over ranks r of slot_r[off + i] */
static void reduce_slots(struct ncclComm *c, size_t off, void *dst, size_t n, ncclDataType_t t, ncclRedOp_t op)
{
    double scale = op >= ncclNumOps ? premul_scalar[(op - ncclNumOps) % MAX_CUSTOM_OPS] : 1.0;
    for (size_t i = 0; i < n; i++) {
        double acc = 0;
        for (int r = 0; r < c->nranks; r++) {
            double v = load(twin_slot(c, r) + off, i, t) * scale;
            if (r == 0)
                acc = v;
            else if (op == ncclProd)
                acc *= v;
            else if (op == ncclMax)
                acc = v > acc ? v : acc;
            else if (op == ncclMin)
                acc = v < acc ? v : acc;
            else
                acc += v;
        }
        store(dst, i, t, op == ncclAvg ? acc / c->nranks : acc);
    }
}

/* ncclInvalidArgument for a bad comm, type, op or NULL buffer (NCCL 2.28.9 src/enqueue.cc ArgsCheck). */
static int args_ok(const struct ncclComm *c, const void *send, const void *recv, size_t count, ncclDataType_t t)
{
    size_t size = twin_type_size(t);
    return twin_comm_ok(c) && size != 0 && (count == 0 || (send != NULL && recv != NULL));
}

static int op_ok(ncclRedOp_t op) { return (int)op >= ncclSum && (int)op < next_custom_op; }

static void trace_call(const struct ncclComm *c, const char *fn, size_t count)
{
    if (twin_trace_on())
        fprintf(stderr, "[twin nccl %d] %s comm %p rank %d/%d count %zu\n", (int)getpid(), fn, (void *)c,
                c->rank, c->nranks, count);
}

#define STEP(call) do { ncclResult_t rc_ = (call); if (rc_ != ncclSuccess) return rc_; } while (0)
#define COLL(fn, f, ...) \
    twin_submit(&(struct twin_task){ .kind = TWIN_COLL, .run = fn, .func = TWIN_F_##f, __VA_ARGS__ })

static ncclResult_t run_all_reduce(const struct twin_task *t)
{
    struct ncclComm *comm = t->comm;
    size_t ts = twin_type_size(t->type), chunk = twin_slot_bytes(comm) / ts;
    for (size_t o = 0; o < t->count; o += chunk) {
        size_t k = MIN(chunk, t->count - o);
        memcpy(twin_slot(comm, comm->rank), (const char *)t->send + o * ts, k * ts);
        STEP(twin_barrier(comm));
        reduce_slots(comm, 0, (char *)t->recv + o * ts, k, t->type, t->op);
        STEP(twin_barrier(comm));
    }
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    if (!args_ok(comm, sendbuff, recvbuff, count, datatype) || !op_ok(op))
        return ncclInvalidArgument;
    trace_call(comm, __func__, count);
    return COLL(run_all_reduce, ALLREDUCE, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype,
                .op = op, .comm = comm, .stream = stream);
}

/* Only the root's recvbuff is written (nccl.h: "recvbuff ... only used on the root rank"). */
static ncclResult_t run_reduce(const struct twin_task *t)
{
    struct ncclComm *comm = t->comm;
    size_t ts = twin_type_size(t->type), chunk = twin_slot_bytes(comm) / ts;
    for (size_t o = 0; o < t->count; o += chunk) {
        size_t k = MIN(chunk, t->count - o);
        memcpy(twin_slot(comm, comm->rank), (const char *)t->send + o * ts, k * ts);
        STEP(twin_barrier(comm));
        if (comm->rank == t->root)
            reduce_slots(comm, 0, (char *)t->recv + o * ts, k, t->type, t->op);
        STEP(twin_barrier(comm));
    }
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    if (!args_ok(comm, sendbuff, sendbuff, count, datatype) || !op_ok(op) || root < 0 || root >= comm->nranks)
        return ncclInvalidArgument;
    trace_call(comm, __func__, count);
    return COLL(run_reduce, REDUCE, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype, .op = op,
                .root = root, .comm = comm, .stream = stream);
}

/* sendbuff is only read on the root (nccl.h ncclBroadcast). */
static ncclResult_t run_broadcast(const struct twin_task *t)
{
    struct ncclComm *comm = t->comm;
    size_t n = t->count * twin_type_size(t->type), slot = twin_slot_bytes(comm);
    for (size_t o = 0; o < n; o += slot) {
        size_t k = MIN(slot, n - o);
        if (comm->rank == t->root)
            memcpy(twin_slot(comm, t->root), (const char *)t->send + o, k);
        STEP(twin_barrier(comm));
        if (comm->rank != t->root || t->recv != t->send)
            memcpy((char *)t->recv + o, twin_slot(comm, t->root), k);
        STEP(twin_barrier(comm));
    }
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         int root, ncclComm_t comm, cudaStream_t stream)
{
    if (!args_ok(comm, recvbuff, recvbuff, count, datatype) || root < 0 || root >= comm->nranks
        || (comm->rank == root && count > 0 && sendbuff == NULL))
        return ncclInvalidArgument;
    trace_call(comm, __func__, count);
    return COLL(run_broadcast, BROADCAST, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype,
                .root = root, .comm = comm, .stream = stream);
}

/* Legacy in-place broadcast (nccl.h: ncclBcast is ncclBroadcast with sendbuff == recvbuff). */
NCCL_API(ncclResult_t, ncclBcast, void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
         cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

/* recvbuff holds nranks * sendcount elements, rank-major (nccl.h ncclAllGather). */
static ncclResult_t run_all_gather(const struct twin_task *t)
{
    struct ncclComm *comm = t->comm;
    size_t n = t->count * twin_type_size(t->type), slot = twin_slot_bytes(comm);
    for (size_t o = 0; o < n; o += slot) {
        size_t k = MIN(slot, n - o);
        memcpy(twin_slot(comm, comm->rank), (const char *)t->send + o, k);
        STEP(twin_barrier(comm));
        for (int r = 0; r < comm->nranks; r++)
            memcpy((char *)t->recv + (size_t)r * n + o, twin_slot(comm, r), k);
        STEP(twin_barrier(comm));
    }
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    if (!args_ok(comm, sendbuff, recvbuff, sendcount, datatype))
        return ncclInvalidArgument;
    trace_call(comm, __func__, sendcount);
    return COLL(run_all_gather, ALLGATHER, .send = sendbuff, .recv = recvbuff, .count = sendcount, .type = datatype,
                .comm = comm, .stream = stream);
}

/* sendbuff holds nranks * recvcount elements; rank r gets the reduction of block r (nccl.h). */
static ncclResult_t run_reduce_scatter(const struct twin_task *t)
{
    struct ncclComm *comm = t->comm;
    size_t ts = twin_type_size(t->type);
    size_t chunk = twin_slot_bytes(comm) / ts / (size_t)comm->nranks; /* slot layout: [destination rank][k] */
    for (size_t o = 0; o < t->count; o += chunk) {
        size_t k = MIN(chunk, t->count - o);
        for (int d = 0; d < comm->nranks; d++)
            memcpy(twin_slot(comm, comm->rank) + (size_t)d * k * ts,
                   (const char *)t->send + ((size_t)d * t->count + o) * ts, k * ts);
        STEP(twin_barrier(comm));
        reduce_slots(comm, (size_t)comm->rank * k * ts, (char *)t->recv + o * ts, k, t->type, t->op);
        STEP(twin_barrier(comm));
    }
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    if (!args_ok(comm, sendbuff, recvbuff, recvcount, datatype) || !op_ok(op))
        return ncclInvalidArgument;
    trace_call(comm, __func__, recvcount);
    return COLL(run_reduce_scatter, REDUCESCATTER, .send = sendbuff, .recv = recvbuff, .count = recvcount,
                .type = datatype, .op = op, .comm = comm, .stream = stream);
}

/* Block d of rank r's sendbuff goes to block r of rank d's recvbuff (nccl.h ncclAlltoAll). */
static ncclResult_t run_all_to_all(const struct twin_task *t)
{
    struct ncclComm *comm = t->comm;
    size_t ts = twin_type_size(t->type), chunk = twin_slot_bytes(comm) / ts / (size_t)comm->nranks;
    for (size_t o = 0; o < t->count; o += chunk) {
        size_t k = MIN(chunk, t->count - o);
        for (int d = 0; d < comm->nranks; d++)
            memcpy(twin_slot(comm, comm->rank) + (size_t)d * k * ts,
                   (const char *)t->send + ((size_t)d * t->count + o) * ts, k * ts);
        STEP(twin_barrier(comm));
        for (int r = 0; r < comm->nranks; r++)
            memcpy((char *)t->recv + ((size_t)r * t->count + o) * ts,
                   twin_slot(comm, r) + (size_t)comm->rank * k * ts, k * ts);
        STEP(twin_barrier(comm));
    }
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
         ncclComm_t comm, cudaStream_t stream)
{
    if (!args_ok(comm, sendbuff, recvbuff, count, datatype))
        return ncclInvalidArgument;
    trace_call(comm, __func__, count);
    return COLL(run_all_to_all, ALLTOALL, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype,
                .comm = comm, .stream = stream);
}

/* ncclScalarHostImmediate reads the scalar now; ncclScalarDevice would read it while the collective runs,
 * which is the same memory here (device memory is host memory) but read now: a later change is missed. */
NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
         ncclScalarResidence_t residence, ncclComm_t comm)
{
    int id;
    (void)residence;
    if (op == NULL || scalar == NULL || !twin_comm_ok(comm) || twin_type_size(datatype) == 0)
        return ncclInvalidArgument;
    id = __atomic_fetch_add(&next_custom_op, 1, __ATOMIC_RELAXED);
    premul_scalar[(id - ncclNumOps) % MAX_CUSTOM_OPS] = load(scalar, 0, datatype);
    *op = (ncclRedOp_t)id;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm)
{
    if (!twin_comm_ok(comm) || (int)op < ncclNumOps)
        return ncclInvalidArgument; /* built-in ops cannot be destroyed (src/enqueue.cc ncclRedOpDestroy) */
    return ncclSuccess;
}
