/*
 * stand_in_nccl: a STAND-IN for libnccl.so.2 -- not NVIDIA's library -- for
 * tests and `otel-ebpf demo` on machines without a GPU.  It exports the
 * NCCL 2.x host API with the exact signatures, enum values and calling
 * convention of nccl.h (checked against nccl.h 2.32.3 from the
 * nvidia-nccl-cu12 wheel), so uprobes decode the same registers and stack
 * slots as on the real library.  It moves no data between processes: every
 * rank computes locally.
 *
 * Build (otel_ebpf/demo/build.py does this, for the tests too):
 *   gcc -O1 -g -fno-omit-frame-pointer -fno-shrink-wrap -fPIC -shared
 *       -Wl,-soname,libnccl.so.2
 * Those two flags make every function that has a frame start with
 * `push %rbp`, as most of the real library's entry points do; the kernel
 * emulates a push for a uprobe, while most other first instructions are
 * single-stepped (about 10x the cost), which would make overhead numbers
 * meaningless.  Without -fno-shrink-wrap gcc 12 -O1 moves the prologue after
 * the argument checks (ncclCommInitRank then began with `test %rdi,%rdi`).
 * The two frameless leaves begin as in NCCL 2.32.3: ncclGetVersion with
 * `test %rdi,%rdi`, ncclGetErrorString with `cmp $0x8,%edi`.
 *
 * Like the real library, each entry point is a strong `pnccl*` symbol (the
 * profiling interface) with a weak `nccl*` alias at the same address.
 *
 * Behaviour:
 * - ncclGetUniqueId fills the 128 bytes from /dev/urandom.
 * - A communicator is a heap struct holding rank, nranks, device (= rank, as
 *   there is no CUDA device to ask) and a copy of the unique id.
 * - Collectives validate their arguments (ncclInvalidArgument = 4 on a bad
 *   comm, datatype, op, root, peer or NULL buffer), read every input byte
 *   into a checksum kept in the comm, and write every output byte as a
 *   one-rank reduction would (recv = send, or the rank's slot of it).
 * - ncclGroupStart/End nest; inside a group operations are only counted,
 *   ncclGroupEnd of the outermost group runs the delay once.
 * - STAND_IN_NCCL_DELAY_US=D (read at the first collective) makes every
 *   collective outside a group, and every outermost ncclGroupEnd that
 *   closes a non-empty group, sleep D microseconds before returning: a slow
 *   or straggler rank.
 * - ncclCommSplit cannot see the other ranks' colors, so the new comm keeps
 *   the parent's rank and nranks (every root and peer stays valid); its id
 *   is the parent id mixed with the color, equal on all ranks of one color.
 *   color == NCCL_SPLIT_NOCOLOR (-1) gives *newcomm = NULL, as in NCCL.
 *   NOT NCCL's split (2.28.9 src/init.cc orders the child's ranks by key, then
 *   parent rank, and sizes it by color): tests use it for the receiver's
 *   argument decoding only and never ask the child its rank or size. Split
 *   ranks and sizes are tested on real torch over the twin's libnccl
 *   (otel_ebpf/twin/nccl_comm.c; tests/twin).
 *
 * ABI of ncclCommInitRank(ncclComm_t*, int nranks, ncclUniqueId, int rank) on
 * x86-64 SysV: ncclUniqueId is 128 bytes, MEMORY class, so the caller copies
 * it to the stack and it takes no register; rank is the THIRD integer arg.
 * Observed with gcc 12.2 -O1 on nccl_rank.c (objdump -d of the call):
 *     mov    -0x160(%rbp),%eax ; mov %eax,%edx   ; rank         -> edx
 *     lea    -0xf8(%rbp),%rax                    ; &comm
 *     add    $0xffffffffffffff80,%rsp            ; 128 bytes for the id
 *     lea    -0xf0(%rbp),%rsi ; mov $0x20,%ecx ; mov %rsp,%rdi
 *     rep movsl                                  ; copy id to 0(%rsp)
 *     mov    %r13d,%esi                          ; nranks       -> esi
 *     mov    %rax,%rdi                           ; &comm        -> rdi
 *     call   *nccl+0x8                           ; ncclCommInitRank
 * and a standalone caller (gcc -S) copied the id with 8 movdqu/movups
 * pairs to 0..127(%rsp), then `movl $3,%edx ; movl $4,%esi ; call`.
 * So at entry: rdi=comm*, esi=nranks, edx=rank, id = 8(%rsp)..135(%rsp)
 * (0(%rsp) is the return address).  ncclCommInitRankConfig adds config in
 * rcx.  Same for the stand-in's own definition and the real library.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- nccl.h (NCCL 2.x) types, values as in nccl.h 2.32.3 ---- */

#define NCCL_MAJOR 2
#define NCCL_MINOR 32
#define NCCL_PATCH 3
#define NCCL_VERSION_CODE (NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH)
#define NCCL_UNIQUE_ID_BYTES 128
#define NCCL_SPLIT_NOCOLOR -1

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
typedef struct ncclConfig_v23100 ncclConfig_t;   /* opaque here: never dereferenced */
typedef void *cudaStream_t;

typedef enum {
    ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
    ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7,
    ncclTimeout = 8, ncclNumResults = 9
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
    ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11, ncclNumTypes = 12
} ncclDataType_t;

_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
_Static_assert(sizeof(ncclRedOp_t) == 4 && sizeof(ncclDataType_t) == 4, "enums are ints");

#define EXPORT __attribute__((visibility("default")))
/* Strong pnccl* definition plus weak nccl* alias, as libnccl.so.2 does. */
#define NCCL_API(ret, name, ...)                                                  \
    EXPORT ret name(__VA_ARGS__) __attribute__((weak, alias("p" #name)));         \
    EXPORT ret p##name(__VA_ARGS__)

#define COMM_MAGIC 0x6e63636c5354414eULL   /* "ncclSTAN" */

struct ncclComm {
    uint64_t magic;
    int rank;
    int nranks;
    int device;
    int aborted;
    ncclUniqueId id;
    uint64_t checksum;   /* FNV-1a over every byte read from send buffers */
    uint64_t ops;        /* operations issued on this comm */
};

static __thread int group_depth;
static __thread int group_ops;
static long delay_us = -1;
static pthread_once_t delay_once = PTHREAD_ONCE_INIT;

/* ---- helpers ---- */

static void read_delay(void)
{
    const char *s = getenv("STAND_IN_NCCL_DELAY_US");
    long v = s != NULL ? strtol(s, NULL, 10) : 0;
    __atomic_store_n(&delay_us, v > 0 ? v : 0, __ATOMIC_RELEASE);
}

static void straggle(void)
{
    pthread_once(&delay_once, read_delay);
    long us = __atomic_load_n(&delay_us, __ATOMIC_ACQUIRE);
    if (us <= 0)
        return;
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static int comm_ok(const struct ncclComm *c)
{
    return c != NULL && c->magic == COMM_MAGIC && !c->aborted && c->nranks > 0;
}

static uint64_t fnv1a(uint64_t h, const void *buf, size_t n)
{
    const volatile unsigned char *p = buf;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

/* Reads `n` bytes of input into the comm's checksum. */
static void consume(struct ncclComm *c, const void *buf, size_t n)
{
    c->checksum = fnv1a(c->checksum ? c->checksum : 0xcbf29ce484222325ULL, buf, n);
}

/* Writes `n` bytes of output: a copy of `src` or, without one, zeros. */
static void produce(void *dst, const void *src, size_t n)
{
    if (src != NULL)
        memmove(dst, src, n);
    else
        memset(dst, 0, n);
}

/* Common end of every operation: count it, delay unless grouped. */
static ncclResult_t finish(struct ncclComm *c)
{
    c->ops++;
    if (group_depth > 0)
        group_ops++;
    else
        straggle();
    return ncclSuccess;
}

static ncclResult_t new_comm(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank, int device)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return ncclSystemError;
    c->magic = COMM_MAGIC;
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    memcpy(&c->id, id, sizeof(c->id));
    c->checksum = fnv1a(0xcbf29ce484222325ULL, id, sizeof(*id));
    *out = c;
    return ncclSuccess;
}

/* ---- version, ids, errors ---- */

NCCL_API(ncclResult_t, ncclGetVersion, int *version)
{
    if (version == NULL)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

/* Not the exported entry point, so ncclCommInitAll does not fire its probe. */
static ncclResult_t random_id(ncclUniqueId *uniqueId)
{
    size_t got = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ncclSystemError;
    while (got < sizeof(*uniqueId)) {
        ssize_t n = read(fd, uniqueId->internal + got, sizeof(*uniqueId) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            return ncclSystemError;
        }
        got += (size_t)n;
    }
    close(fd);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGetUniqueId, ncclUniqueId *uniqueId)
{
    if (uniqueId == NULL)
        return ncclInvalidArgument;
    return random_id(uniqueId);
}

NCCL_API(const char *, ncclGetErrorString, ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclTimeout: return "NCCL operation timed out";
    default: return "unknown result code";
    }
}

/* ---- communicators ---- */

NCCL_API(ncclResult_t, ncclCommInitRank, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    return new_comm(comm, nranks, &commId, rank, rank);
}

NCCL_API(ncclResult_t, ncclCommInitRankConfig, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
         ncclConfig_t *config)
{
    (void)config;   /* blocking, CTA counts, names: nothing to configure here */
    if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    return new_comm(comm, nranks, &commId, rank, rank);
}

NCCL_API(ncclResult_t, ncclCommInitAll, ncclComm_t *comm, int ndev, const int *devlist)
{
    ncclUniqueId id;
    ncclResult_t rc;

    if (comm == NULL || ndev < 1)
        return ncclInvalidArgument;
    rc = random_id(&id);
    if (rc != ncclSuccess)
        return rc;
    for (int i = 0; i < ndev; i++) {
        if (devlist != NULL && devlist[i] < 0)
            rc = ncclInvalidArgument;
        else
            rc = new_comm(&comm[i], ndev, &id, i, devlist != NULL ? devlist[i] : i);
        if (rc != ncclSuccess) {
            while (i-- > 0) {
                free(comm[i]);
                comm[i] = NULL;
            }
            return rc;
        }
    }
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
         ncclConfig_t *config)
{
    ncclUniqueId id;

    (void)key;      /* would order ranks inside the color; see header */
    (void)config;
    if (!comm_ok(comm) || newcomm == NULL || color < NCCL_SPLIT_NOCOLOR)
        return ncclInvalidArgument;
    if (color == NCCL_SPLIT_NOCOLOR) {
        *newcomm = NULL;
        return ncclSuccess;
    }
    memcpy(&id, &comm->id, sizeof(id));
    for (size_t i = 0; i < sizeof(id.internal); i++)
        id.internal[i] ^= (char)((uint32_t)color * 0x9e3779b9u >> (8 * (i % 4)));
    return new_comm(newcomm, comm->nranks, &id, comm->rank, comm->device);
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;   /* NCCL accepts a NULL comm here */
    if (comm->magic != COMM_MAGIC)
        return ncclInvalidArgument;
    comm->magic = 0;
    free(comm);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm)
{
    if (comm == NULL)
        return ncclSuccess;
    if (comm->magic != COMM_MAGIC)
        return ncclInvalidArgument;
    comm->aborted = 1;
    comm->magic = 0;
    free(comm);
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int *count)
{
    if (!comm_ok(comm) || count == NULL)
        return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int *device)
{
    if (!comm_ok(comm) || device == NULL)
        return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int *rank)
{
    if (!comm_ok(comm) || rank == NULL)
        return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

/* ---- collectives and point-to-point ---- */

/* Shared argument check; sets *bytes to count * sizeof(datatype). */
static int args_ok(const struct ncclComm *c, const void *buf, size_t count, ncclDataType_t t, size_t *bytes)
{
    size_t size = type_size(t);
    if (!comm_ok(c) || size == 0 || (count > 0 && buf == NULL) || count > SIZE_MAX / size / (size_t)c->nranks)
        return 0;
    *bytes = count * size;
    return 1;
}

static int op_ok(ncclRedOp_t op)
{
    return (int)op >= ncclSum && op < ncclNumOps;
}

NCCL_API(ncclResult_t, ncclAllReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    size_t n;
    (void)stream;
    if (!args_ok(comm, recvbuff, count, datatype, &n) || !op_ok(op) || (count > 0 && sendbuff == NULL))
        return ncclInvalidArgument;
    consume(comm, sendbuff, n);
    produce(recvbuff, sendbuff, n);
    return finish(comm);
}

NCCL_API(ncclResult_t, ncclBroadcast, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    size_t n;
    (void)stream;
    if (!args_ok(comm, recvbuff, count, datatype, &n) || root < 0 || root >= comm->nranks)
        return ncclInvalidArgument;
    if (comm->rank == root) {
        if (count > 0 && sendbuff == NULL)
            return ncclInvalidArgument;
        consume(comm, sendbuff, n);
        produce(recvbuff, sendbuff, n);
    } else {
        produce(recvbuff, NULL, n);
    }
    return finish(comm);
}

NCCL_API(ncclResult_t, ncclReduce, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    size_t n;
    (void)stream;
    if (!args_ok(comm, sendbuff, count, datatype, &n) || !op_ok(op) || root < 0 || root >= comm->nranks)
        return ncclInvalidArgument;
    consume(comm, sendbuff, n);
    if (comm->rank == root) {
        if (count > 0 && recvbuff == NULL)
            return ncclInvalidArgument;
        produce(recvbuff, sendbuff, n);
    }
    return finish(comm);
}

/* recvbuff holds nranks * sendcount elements; this rank's slot gets sendbuff. */
NCCL_API(ncclResult_t, ncclAllGather, const void *sendbuff, void *recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    size_t n;
    (void)stream;
    if (!args_ok(comm, recvbuff, sendcount, datatype, &n) || (sendcount > 0 && sendbuff == NULL))
        return ncclInvalidArgument;
    consume(comm, sendbuff, n);
    for (int r = 0; r < comm->nranks; r++)
        produce((char *)recvbuff + (size_t)r * n, r == comm->rank ? sendbuff : NULL, n);
    return finish(comm);
}

/* sendbuff holds nranks * recvcount elements; recvbuff gets this rank's slot. */
NCCL_API(ncclResult_t, ncclReduceScatter, const void *sendbuff, void *recvbuff, size_t recvcount,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    size_t n;
    (void)stream;
    if (!args_ok(comm, recvbuff, recvcount, datatype, &n) || !op_ok(op) || (recvcount > 0 && sendbuff == NULL))
        return ncclInvalidArgument;
    consume(comm, sendbuff, n * (size_t)comm->nranks);
    produce(recvbuff, (const char *)sendbuff + (size_t)comm->rank * n, n);
    return finish(comm);
}

/* Both buffers hold nranks * count elements. */
NCCL_API(ncclResult_t, ncclAlltoAll, const void *sendbuff, void *recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    size_t n;
    (void)stream;
    if (!args_ok(comm, recvbuff, count, datatype, &n) || (count > 0 && sendbuff == NULL))
        return ncclInvalidArgument;
    consume(comm, sendbuff, n * (size_t)comm->nranks);
    produce(recvbuff, sendbuff, n * (size_t)comm->nranks);
    return finish(comm);
}

NCCL_API(ncclResult_t, ncclSend, const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream)
{
    size_t n;
    (void)stream;
    if (!args_ok(comm, sendbuff, count, datatype, &n) || peer < 0 || peer >= comm->nranks)
        return ncclInvalidArgument;
    consume(comm, sendbuff, n);
    return finish(comm);
}

NCCL_API(ncclResult_t, ncclRecv, void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
         ncclComm_t comm, cudaStream_t stream)
{
    size_t n;
    (void)stream;
    if (!args_ok(comm, recvbuff, count, datatype, &n) || peer < 0 || peer >= comm->nranks)
        return ncclInvalidArgument;
    produce(recvbuff, NULL, n);
    return finish(comm);
}

/* ---- groups ---- */

NCCL_API(ncclResult_t, ncclGroupStart, void)
{
    if (group_depth == 0)
        group_ops = 0;
    group_depth++;
    return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGroupEnd, void)
{
    if (group_depth == 0)
        return ncclInvalidUsage;
    if (--group_depth == 0 && group_ops > 0) {
        group_ops = 0;
        straggle();
    }
    return ncclSuccess;
}
