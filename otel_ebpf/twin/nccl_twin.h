/*
 * Internal header of the twin's stand-in libnccl.so.2 (nccl_comm.c: communicators; nccl_coll.c: data
 * movement).  The public prototypes come from the real nccl.h of the NCCL torch 2.11.0 pins
 * (nvidia-nccl-cu13 2.28.9; scripts/setup.sh extracts it), so each definition is checked against them.
 */
#ifndef OTEL_EBPF_TWIN_NCCL_H
#define OTEL_EBPF_TWIN_NCCL_H

#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

/* As NCCL 2.28.9 src/include/core.h NCCL_API: the weak `nccl*` definition, and `pnccl*` (the profiling
 * interface) an alias of it at the same address. */
#define NCCL_API(ret, func, ...)                                                             \
    __attribute__((visibility("default"))) __attribute__((alias(#func))) ret p##func(__VA_ARGS__); \
    __attribute__((visibility("default"))) __attribute__((weak)) ret func(__VA_ARGS__)

#define TWIN_COMM_MAGIC 0x6e63636c5457494eULL /* "ncclTWIN" */

/* The shared staging area of one communicator: a header page (barrier), then one slot per rank. */
struct twin_shm {
    char *base;
    size_t len;
    size_t slot;
};

/* Where the comm's last launched work sits (cudart_streams.c owns and moves it): all work of a comm runs in launch
 * order, as NCCL's per-comm device stream orders it (comm->sharedRes->deviceStream). */
struct twin_order { void *stream; uint64_t pos; };

struct ncclComm {
    uint64_t magic;
    uint64_t hash;     /* NCCL's commHash: root = hash(unique id), child = hash(parent, split count, color) */
    int rank;
    int nranks;
    int device;
    volatile int aborted; /* set by ncclCommAbort from the watchdog thread while a collective may wait */
    int split_count;      /* splits of this comm so far (NCCL: comm->splitCount) */
    int blocking;         /* config.blocking after NCCL_COMM_BLOCKING (src/init.cc envConfigOverride) */
    ncclResult_t async_result; /* NCCL's comm->asyncResult: ncclInProgress while an init or split runs */
    struct twin_shm shm;  /* mapped at creation: every rank of the comm joins it */
    struct twin_order order;
    int pending;          /* launched groups holding one of its operations, not yet run (nccl_group.c) */
    uint32_t node;        /* OTEL_EBPF_TWIN_NODE of this rank, for dead-peer detection (twin_peer_lost) */
};

int twin_comm_ok(const struct ncclComm *c);
int twin_trace_on(void);
uint64_t twin_hash(uint64_t h, const void *buf, size_t n);

/* Maps the communicator's staging area (a file under $OTEL_EBPF_TWIN_DIR named by its hash). */
ncclResult_t twin_shm_open(struct ncclComm *c);
void twin_shm_close(struct ncclComm *c);
char *twin_slot(const struct ncclComm *c, int rank);
size_t twin_slot_bytes(const struct ncclComm *c);
/* Waits until every rank of the comm has arrived; ncclRemoteError when the comm was aborted meanwhile. */
ncclResult_t twin_barrier(struct ncclComm *c);
/* Every rank's `n` bytes at `mine`, gathered in rank order into `all` (n * nranks bytes): the bootstrap's
 * exchange, with its own barrier, apart from the comm's stream work. */
ncclResult_t twin_allgather_bytes(struct ncclComm *c, const void *mine, void *all, size_t n);

/* While waiting for peers: every ~100 ms, whether a rank of the comm on another node has exited; if so the
 * comm's async result becomes ncclRemoteError (the waiter keeps waiting, as NCCL's kernel does, until the
 * comm is aborted).  NCCL's network transports see a dead remote peer as a closed connection
 * (src/transport/net_socket.cc: "Connection closed by remote peer" -> ncclRemoteError, set on the comm by the
 * proxy thread, src/proxy.cc); its shared-memory and P2P transports within a node never notice. */
void twin_peer_check(struct ncclComm *c, long *polls);

void twin_set_last_error(const char *msg);
size_t twin_type_size(ncclDataType_t t);

/* One NCCL operation as enqueued (nccl_group.c): a collective's arguments and the function that runs it,
 * or a send/recv with its progress.  As NCCL 2.28.9 src/enqueue.cc ncclEnqueueCheck, every call is a group:
 * outside ncclGroupStart/End a group of one, run at once; inside, kept until the outermost ncclGroupEnd. */
enum twin_kind { TWIN_COLL, TWIN_SEND, TWIN_RECV };
struct twin_task {
    enum twin_kind kind;
    ncclResult_t (*run)(const struct twin_task *t); /* TWIN_COLL only */
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    int root; /* the root of a rooted collective, the peer of a send/recv */
    struct ncclComm *comm;
    cudaStream_t stream;
    size_t done;  /* p2p: bytes of (header, payload) moved so far */
    uint64_t hdr; /* p2p: the payload size, sent ahead of it */
    int after;    /* p2p: the group's previous send (recv) on the same comm to (from) the same peer; -1: none */
};
ncclResult_t twin_submit(const struct twin_task *t);

/* The twin's libcudart.so.13 (cudart_streams.c): runs fn(arg) on streams[0]'s worker after every stream's prior
 * work and after each comm's last launched work (`orders`, updated), and makes the others wait for it;
 * *captured = 0.  When the streams capture, fn(arg) becomes a host node of the capture's graph instead, run at
 * each replay: *captured = 1 (written before the node exists), `orders` stay, and the graph owns `arg`, freed
 * by destroy(arg) with the last graph or graph exec holding it.  Streams not all in one capture (or none):
 * cudaErrorStreamCaptureIsolation.  Not a CUDA API. */
cudaError_t __cudaTwinLaunch(const cudaStream_t *streams, int n, struct twin_order *const *orders, int norders,
                             void (*fn)(void *), void *arg, void (*destroy)(void *), int *captured);
/* Bytes of the point-to-point mailboxes after the collective slots of a comm's staging area. */
size_t twin_mailbox_bytes(int nranks);

#endif
