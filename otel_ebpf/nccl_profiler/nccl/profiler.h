/*
 * NCCL's profiler plugin ABI, as far as libnccl-profiler-otel_ebpf uses it, in C.
 *
 * Vendored from NVIDIA/nccl (Apache-2.0, Copyright (c) 2017-2026 NVIDIA CORPORATION & AFFILIATES):
 *   ncclResult_t                  v2.28.9-1 ext-profiler/example/nccl/err.h
 *   ncclDebugLogger_t and enums   v2.28.9-1 ext-profiler/example/nccl/common.h
 *   event bits, event states      master (5067397c) src/include/plugin/nccl_profiler.h (v2.28.9-1's plus the CE
 *                                 bits/states that v2.29 added with v6)
 *   ncclProfiler_v5_t and types   v2.28.9-1 src/include/plugin/profiler/profiler_v5.h
 *   ncclProfiler_v6_t and types   v2.29.2-1 .. master src/include/plugin/profiler/profiler_v6.h (unchanged
 *                                 between them but for ncclPid_t, which is pid_t on Linux: os/linux.h)
 * Changes: C instead of C++ (stdbool/stdint includes, typedef'd enums), comments shortened, nothing else. Field
 * order and types are NCCL's: the layouts are the ABI.
 */
#ifndef OE_NCCL_PROFILER_ABI_H
#define OE_NCCL_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
               ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6 } ncclResult_t;

typedef enum { NCCL_LOG_NONE = 0, NCCL_LOG_VERSION = 1, NCCL_LOG_WARN = 2, NCCL_LOG_INFO = 3, NCCL_LOG_ABORT = 4,
               NCCL_LOG_TRACE = 5 } ncclDebugLogLevel;
typedef enum { NCCL_INIT = 1, NCCL_COLL = 2, NCCL_P2P = 4, NCCL_SHM = 8, NCCL_NET = 16, NCCL_GRAPH = 32,
               NCCL_TUNING = 64, NCCL_ENV = 128, NCCL_ALLOC = 256, NCCL_CALL = 512, NCCL_PROXY = 1024,
               NCCL_NVLS = 2048, NCCL_BOOTSTRAP = 4096, NCCL_REG = 8192, NCCL_ALL = ~0 } ncclDebugLogSubSys;
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                                  const char *fmt, ...);

enum {
    ncclProfileGroup = (1 << 0),         /* group event type */
    ncclProfileColl = (1 << 1),          /* host collective call event type */
    ncclProfileP2p = (1 << 2),           /* host point-to-point call event type */
    ncclProfileProxyOp = (1 << 3),       /* proxy operation event type */
    ncclProfileProxyStep = (1 << 4),     /* proxy step event type */
    ncclProfileProxyCtrl = (1 << 5),     /* proxy control event type */
    ncclProfileKernelCh = (1 << 6),      /* kernel channel event type */
    ncclProfileNetPlugin = (1 << 7),     /* network plugin-defined, events */
    ncclProfileGroupApi = (1 << 8),      /* Group API events */
    ncclProfileCollApi = (1 << 9),       /* Collective API events */
    ncclProfileP2pApi = (1 << 10),       /* Point-to-Point API events */
    ncclProfileKernelLaunch = (1 << 11), /* Kernel launch events */
    ncclProfileCeColl = (1 << 12),       /* v6: CE collective operation */
    ncclProfileCeSync = (1 << 13),       /* v6: CE synchronization operation */
    ncclProfileCeBatch = (1 << 14),      /* v6: CE batch operation */
};

typedef enum {
    ncclProfilerProxyOpSendPosted = 0, ncclProfilerProxyOpSendRemFifoWait = 1, ncclProfilerProxyOpSendTransmitted = 2,
    ncclProfilerProxyOpSendDone = 3, ncclProfilerProxyOpRecvPosted = 4, ncclProfilerProxyOpRecvReceived = 5,
    ncclProfilerProxyOpRecvTransmitted = 6, ncclProfilerProxyOpRecvDone = 7, ncclProfilerProxyOpInProgress_v4 = 19,
    ncclProfilerProxyStepSendGPUWait = 8, ncclProfilerProxyStepSendPeerWait_v4 = 20, ncclProfilerProxyStepSendWait = 9,
    ncclProfilerProxyStepRecvWait = 10, ncclProfilerProxyStepRecvFlushWait = 11, ncclProfilerProxyStepRecvGPUWait = 12,
    ncclProfilerProxyCtrlIdle = 13, ncclProfilerProxyCtrlActive = 14, ncclProfilerProxyCtrlSleep = 15,
    ncclProfilerProxyCtrlWakeup = 16, ncclProfilerProxyCtrlAppend = 17, ncclProfilerProxyCtrlAppendEnd = 18,
    ncclProfilerNetPluginUpdate = 21,
    ncclProfilerKernelChStop = 22,
    ncclProfilerGroupStartApiStop = 23, ncclProfilerGroupEndApiStart = 24,
    /* v6 (CE) states */
    ncclProfilerCeCollStart = 25, ncclProfilerCeCollComplete = 26, ncclProfilerCeSyncStart = 27,
    ncclProfilerCeSyncComplete = 28, ncclProfilerCeBatchStart = 29, ncclProfilerCeBatchComplete = 30,
} ncclProfilerEventState_t;

typedef ncclProfilerEventState_t ncclProfilerEventState_v5_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;

/* The union members every version since v5 has, in v5's order (v6 appends the CE ones). */
#define OE_NCCL_DESCR_V5_MEMBERS                                                                                     \
    struct { bool graphCaptured; int groupDepth; } groupApi;                                                         \
    struct { const char *func; size_t count; const char *datatype; int root; void *stream; bool graphCaptured; }     \
        collApi;                                                                                                     \
    struct { const char *func; size_t count; const char *datatype; void *stream; bool graphCaptured; } p2pApi;       \
    struct { void *stream; } kernelLaunch;                                                                           \
    struct {                                                                                                         \
        uint64_t seqNumber; const char *func; void const *sendBuff; void *recvBuff; size_t count; int root;          \
        const char *datatype; uint8_t nChannels; uint8_t nWarps; const char *algo; const char *proto;                \
        void *parentGroup;                                                                                           \
    } coll;                                                                                                          \
    struct { const char *func; void *buff; const char *datatype; size_t count; int peer; uint8_t nChannels;          \
             void *parentGroup; } p2p;                                                                               \
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;               \
    struct { int step; } proxyStep;                                                                                  \
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;                                                         \
    struct { int64_t id; void *data; } netPlugin;

typedef struct {
    uint64_t type;   /* event type descriptor: ncclProfileColl, ... */
    void *parentObj; /* the profiler parent object (for coll: the CollApi event; coll.parentGroup: the group) */
    int rank;        /* originating rank */
    union { OE_NCCL_DESCR_V5_MEMBERS };
} ncclProfilerEventDescr_v5_t;

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        OE_NCCL_DESCR_V5_MEMBERS
        struct {
            uint64_t seqNumber; const char *func; void const *sendBuff; void *recvBuff; size_t count; int root;
            const char *datatype; const char *syncStrategy; bool intraBatchSync; uint32_t batchSize;
            uint32_t numBatches; uint32_t ceSeqNum; void *stream;
        } ceColl;
        struct { bool isComplete; int nRanks; } ceCollSync;
        struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
    };
} ncclProfilerEventDescr_v6_t;

typedef union {
    struct { size_t transSize; } proxyStep;
    struct { int appendedProxyOps; } proxyCtrl;
    struct { void *data; } netPlugin;
    struct { uint64_t pTimer; } kernelCh;
} ncclProfilerEventStateArgs_v5_t;
typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v6_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName, int nNodes,
                         int nranks, int rank, ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v5_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_v5_t eState,
                                     ncclProfilerEventStateArgs_v5_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} ncclProfiler_v5_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName, int nNodes,
                         int nranks, int rank, ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v6_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_v6_t eState,
                                     ncclProfilerEventStateArgs_v6_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} ncclProfiler_v6_t;

/* v6 extends v5's descriptor at the end of its union only: a v5 event read through either is the same. */
_Static_assert(offsetof(ncclProfilerEventDescr_v6_t, coll.parentGroup) ==
               offsetof(ncclProfilerEventDescr_v5_t, coll.parentGroup), "v5/v6 descriptor prefix");
_Static_assert(offsetof(ncclProfilerEventDescr_v6_t, netPlugin.data) ==
               offsetof(ncclProfilerEventDescr_v5_t, netPlugin.data), "v5/v6 descriptor prefix");
_Static_assert(sizeof(ncclProfilerEventDescr_v6_t) >= sizeof(ncclProfilerEventDescr_v5_t), "v6 extends v5");

#endif
