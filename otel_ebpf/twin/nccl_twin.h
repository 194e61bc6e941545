/*
 * Internal header of the twin's stand-in libnccl.so.2 (nccl_comm.c: communicators; nccl_coll.c: data
 * movement; nccl_group.c: groups and p2p; nccl_profiler.c, nccl_prof_*.c: the profiler plugin).  The public
 * prototypes come from the real nccl.h of the NCCL torch 2.11.0 pins (nvidia-nccl-cu13 2.28.9; scripts/setup.sh
 * extracts it), so each definition is checked against them.
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

/* NCCL 2.28.9 src/include/nccl_common.h ncclFunc_t: the profiler's function names and seqNumber's index. */
enum twin_func {
    TWIN_F_BROADCAST, TWIN_F_REDUCE, TWIN_F_ALLGATHER, TWIN_F_REDUCESCATTER, TWIN_F_ALLREDUCE, TWIN_F_SENDRECV,
    TWIN_F_SEND, TWIN_F_RECV, TWIN_F_ALLTOALL, TWIN_F_SCATTER, TWIN_F_GATHER, TWIN_NFUNCS
};
/* The channels of the twin's "topology" (comm->nChannels, comm->p2pnChannels): two, as NCCL gives two GPUs on
 * one PCIe switch; nccl_prof_order.c picks each operation's channels among them. */
#define TWIN_NCHANNELS 2

/* A comm's profiler state (nccl_profiler.c, nccl_prof_*.c), NCCL 2.28.9 struct ncclComm's commHash,
 * profilerContext, seqNumber[] and profiler.workCounter[], and its proxy thread (src/proxy.cc). */
struct twin_prof_proxy;
struct twin_prof_comm {
    uint64_t hash;        /* commHash: getHash(commId) or, for a child, digestHash(parent hash, split count, color) */
    char *name;           /* config.commName (owned), NULL if none */
    void *ctx;            /* profilerContext, as the plugin's init set it */
    int state;            /* 0: init not called, 1: called, 2: finalized */
    int nnodes;
    uint64_t seq[TWIN_NFUNCS];
    uint64_t wc[TWIN_NCHANNELS];
    struct twin_prof_proxy *proxy;
};

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
    struct twin_prof_comm prof;
};

int twin_comm_ok(const struct ncclComm *c);
/* nccl_comm.c, for nccl_split.c: config.blocking after NCCL_COMM_BLOCKING; config.commName (strdup'ed, or the
 * inherited one's copy); a new comm whose staging area is open and whose profiler init ran (takes id->name); a
 * detached thread running fn(arg). */
int twin_blocking_of(const ncclConfig_t *config, int inherited);
char *twin_comm_name(const ncclConfig_t *config, const char *inherited);
struct twin_prof_comm;
ncclResult_t twin_new_comm(ncclComm_t *out, uint64_t hash, int nranks, int rank, int device, int blocking,
                           const struct twin_prof_comm *id);
ncclResult_t twin_start_job(void *(*fn)(void *), void *arg);
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
    int func;     /* enum twin_func */
    int prof_ops; /* NCCL tasks the profiler made of it (nccl_prof_api.c), 0 when none */
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
/* nccl_p2p.c: every send and recv of tasks[0..ntasks) to completion (ncclRemoteError when a comm is aborted,
 * ncclInvalidUsage on a size mismatch); each one's kernel-channel end goes to prof (NULL: none). */
struct twin_prof_job;
ncclResult_t twin_run_p2p(struct twin_task *tasks, int ntasks, struct twin_prof_job *prof);

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
/* The twin's libcudart.so.13 (cudart_capture.c): 1 when the stream is in an active capture, else 0, recording no
 * error (NCCL's ncclCudaGetCapturingGraph asks cudaStreamGetCaptureInfo).  Not a CUDA API. */
int __cudaTwinStreamCapturing(cudaStream_t stream);

/* ---- the profiler plugin (NCCL 2.28.9 src/plugin/profiler.cc); every hook is a branch when none is loaded ---- */

/* NCCL's getHash / digestHash (src/include/bitops.h): a root comm's commHash of its unique id, a child's. */
uint64_t twin_nccl_hash(const void *bytes, size_t n);
uint64_t twin_nccl_child_hash(uint64_t parent, int split_count, int color);
/* ncclProfilerPluginInit: loads the plugin (first comm) and calls its init for c, on the thread that sets c up;
 * with a plugin, an allgather over c of its ranks' nodes gives nNodes. */
void twin_prof_init(struct ncclComm *c);
/* ncclProfilerPluginFinalize (src/init.cc commFree, after the proxy thread): once per comm, from destroy or abort. */
void twin_prof_finalize(struct ncclComm *c);
void twin_prof_comm_free(struct ncclComm *c);

/* The calling thread's API events (src/enqueue.cc ncclEnqueueCheck, taskAppend; src/group.cc ncclGroupEndInternal). */
void twin_prof_enqueue(void);                          /* profilerGroupDepth++ when a group API event is open */
int twin_prof_append(const struct twin_task *t, int index, int group_depth); /* the NCCL tasks made, 0 if none */
void twin_prof_group_end(void);                        /* profilerGroupDepth--, ncclProfilerGroupEndApiStart */
void twin_prof_group_api_stop(void);                   /* ncclProfilerStopGroupApiEvent */
void twin_prof_group_reset(void);                      /* a group dropped without launching */

/* The outermost group end (nccl_group.c group_run): the thread's NCCL tasks become kernel plans, one per comm
 * (src/enqueue.cc ncclLaunchPrepare); *job gets what the stream engine needs (NULL when nothing is profiled). */
struct twin_prof_group;
struct twin_prof_job;
struct twin_prof_group *twin_prof_prepare(struct twin_prof_job **job);
/* ncclLaunchKernel's KernelLaunch start for the first plan, before the group's one launch; then, after it, the
 * rest of src/group.cc doLaunches: each plan's KernelLaunch and hostStreamPlanTask (Group, Coll, P2p events and
 * seqNumber), or, for a captured plan with proxy ops, nothing until each replay (twin_prof_replay).  Frees g. */
void twin_prof_launch_begin(struct twin_prof_group *g);
void twin_prof_launch_end(struct twin_prof_group *g, int launched, int persistent);
/* seqNumber for collectives no NCCL task of the profiler's stands for (no plugin when they were appended). */
void twin_prof_seq(const struct twin_task *tasks, int n, int persistent);

/* The stream engine's side (nccl_group.c group_job_run): a replay's hostStreamPlanTask, and the kernel's
 * per-channel start and end of work (src/device/common.h profiler(START/STOP), the "GPU globaltimer" being
 * CLOCK_REALTIME in ns when the twin's stream worker starts and finishes the task).  NULL job: nothing. */
void twin_prof_replay(struct twin_prof_job *job);
void twin_prof_stamp(struct twin_prof_job *job, int task, int stop);
void twin_prof_stamp_rest(struct twin_prof_job *job);
void twin_prof_job_free(struct twin_prof_job *job);

#endif
