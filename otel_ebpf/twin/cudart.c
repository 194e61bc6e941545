/*
 * Stand-in libcudart.so.13 for the twin (otel_ebpf/twin, docs/twin.md): lets the real PyTorch CUDA wheel
 * run on a machine with no GPU.  Not NVIDIA's library.
 *
 * Prototypes: compiled against the real CUDA 13.0 `cuda_runtime_api.h` (the nvidia-cuda-runtime 13.0.96
 * wheel torch 2.11.0's cuda-toolkit 13.0.2 pins; scripts/setup.sh extracts its headers), so every exported
 * function has the real signature, and exported under the `libcudart.so.13` version node as the real
 * library does (torch imports `cudaMalloc@libcudart.so.13`).  Exports are exactly what torch 2.11.0 imports.
 *
 * Model (what is the same as on a GPU):
 * - N devices (OTEL_EBPF_TWIN_GPUS, default 2), per-thread current device (cudaSetDevice is per host thread:
 *   CUDA Runtime API 13.0, "Device Management").  Out-of-range devices give cudaErrorInvalidDevice.
 * - Device memory is real, addressable memory: copies and memsets move the bytes, so every host-visible
 *   value (tensor.cpu(), NCCL results) is real data.
 * - Sticky "last error" per thread: cudaGetLastError returns and resets, cudaPeekAtLastError only returns.
 * What differs from a GPU (said in docs/twin.md):
 * - Device memory is host memory (the model's one big simplification): kernels are never run, they are
 *   counted and do nothing, so values a kernel would compute are left as they were.
 * - Work is never asynchronous: copies happen inside the call; streams and events are always complete
 *   (cudaStreamQuery/cudaEventQuery give cudaSuccess, never cudaErrorNotReady); event times are host times at
 *   cudaEventRecord.  NCCL work is synchronous too (nccl_coll.c).
 * - Graph capture, CUDA IPC and driver entry points are refused (cudaErrorNotSupported /
 *   cudaErrorSymbolNotFound), which torch handles as "not available".
 *
 * Env: OTEL_EBPF_TWIN_GPUS=N, OTEL_EBPF_TWIN_TRACE=1 (log calls to stderr).
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define SM_COUNT 132 /* the properties are an H100 SXM's (CUDA 13.0 deviceQuery on one) */

static int trace_on = -1;

static void trace(const char *fn)
{
    if (trace_on < 0) {
        const char *s = getenv("OTEL_EBPF_TWIN_TRACE");
        trace_on = s != NULL && *s != '\0' && *s != '0';
    }
    if (trace_on)
        fprintf(stderr, "[twin cudart %d] %s\n", (int)getpid(), fn);
}
#define T() trace(__func__)

static int device_count(void)
{
    const char *s = getenv("OTEL_EBPF_TWIN_GPUS");
    int n = s != NULL ? atoi(s) : 2;
    return n < 0 ? 0 : n;
}

static __thread int cur_dev;
static __thread cudaError_t last_err = cudaSuccess;

/* Records a failure as the real runtime does: returned now and kept for cudaGetLastError. */
static cudaError_t fail(cudaError_t e)
{
    last_err = e;
    return e;
}

/* ---- allocations: a registry so cudaPointerGetAttributes can answer, as UVA does ---- */
struct alloc { void *p; size_t n; int dev; int host; struct alloc *next; };
static struct alloc *allocs;
static pthread_mutex_t alloc_mu = PTHREAD_MUTEX_INITIALIZER;

static void *do_alloc(size_t n, int host)
{
    size_t len = n ? n : 1;
    /* MAP_NORESERVE: torch's caching allocator asks for large segments it may never touch */
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    struct alloc *a = p == MAP_FAILED ? NULL : malloc(sizeof(*a));
    if (a == NULL) {
        if (p != MAP_FAILED)
            munmap(p, len);
        return NULL;
    }
    *a = (struct alloc){ p, len, cur_dev, host, NULL };
    pthread_mutex_lock(&alloc_mu);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&alloc_mu);
    return p;
}

/* The allocation holding p (interior pointers too); unlinked from the registry when `unlink`. */
static struct alloc *find_alloc(const void *p, int unlink)
{
    struct alloc **pp, *a;
    pthread_mutex_lock(&alloc_mu);
    for (pp = &allocs; (a = *pp) != NULL; pp = &a->next) {
        if ((const char *)p >= (char *)a->p && (const char *)p < (char *)a->p + a->n) {
            if (unlink)
                *pp = a->next;
            break;
        }
    }
    pthread_mutex_unlock(&alloc_mu);
    return a;
}

static cudaError_t do_free(void *p)
{
    struct alloc *a;
    if (p == NULL)
        return cudaSuccess; /* cudaFree(NULL) is a no-op (cuda_runtime_api.h 13.0, cudaFree) */
    a = find_alloc(p, 1);
    if (a == NULL)
        return fail(cudaErrorInvalidValue);
    munmap(a->p, a->n);
    free(a);
    return cudaSuccess;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- versions and errors ---- */
API cudaError_t cudaDriverGetVersion(int *v) { T(); *v = CUDART_VERSION; return cudaSuccess; }
API cudaError_t cudaRuntimeGetVersion(int *v) { T(); *v = CUDART_VERSION; return cudaSuccess; }
API cudaError_t cudaGetLastError(void) { cudaError_t e = last_err; last_err = cudaSuccess; return e; }
API cudaError_t cudaPeekAtLastError(void) { return last_err; }

API const char *cudaGetErrorName(cudaError_t e)
{
    static __thread char buf[48];
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
    default: snprintf(buf, sizeof(buf), "cudaError_%d", (int)e); return buf;
    }
}

API const char *cudaGetErrorString(cudaError_t e)
{
    static __thread char buf[96];
    if (e == cudaSuccess)
        return "no error";
    snprintf(buf, sizeof(buf), "%s (otel-ebpf twin: stand-in CUDA runtime, no GPU)", cudaGetErrorName(e));
    return buf;
}

/* ---- devices ---- */
API cudaError_t cudaGetDeviceCount(int *n)
{
    T();
    *n = device_count();
    return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}
API cudaError_t cudaGetDevice(int *d) { *d = cur_dev; return cudaSuccess; }
API cudaError_t cudaSetDevice(int d)
{
    T();
    if (d < 0 || d >= device_count())
        return fail(cudaErrorInvalidDevice);
    cur_dev = d;
    return cudaSuccess;
}
API cudaError_t cudaDeviceSynchronize(void) { T(); return cudaSuccess; } /* nothing is ever pending */

API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    T();
    if (d < 0 || d >= device_count())
        return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "otel-ebpf twin GPU %d (no GPU)", d);
    for (int i = 0; i < 16; i++)
        p->uuid.bytes[i] = (char)(0x40 + d * 16 + i); /* distinct per device, as NCCL's topology wants */
    p->totalGlobalMem = 80ULL << 30;
    p->sharedMemPerBlock = 48 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9; p->minor = 0;
    p->textureAlignment = 512; p->texturePitchAlignment = 32;
    p->multiProcessorCount = SM_COUNT;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->ECCEnabled = 1;
    p->pciBusID = 0x10 + d;
    p->asyncEngineCount = 3;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 50 << 20;
    p->persistingL2CacheMaxSize = 30 << 20;
    p->maxThreadsPerMultiProcessor = 2048;
    p->streamPrioritiesSupported = 1;
    p->globalL1CacheSupported = 1; p->localL1CacheSupported = 1;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->computePreemptionSupported = 1;
    p->cooperativeLaunch = 1;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->maxBlocksPerMultiProcessor = 32;
    p->accessPolicyMaxWindowSize = 134213632;
    p->reservedSharedMemPerBlock = 1024;
    p->hostRegisterSupported = 1;
    p->memoryPoolsSupported = 1;
    p->ipcEventSupported = 1;
    p->clusterLaunch = 1;
    p->hostNumaId = -1;
    return cudaSuccess;
}

API cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d)
{
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess)
        return cudaErrorInvalidDevice;
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: case cudaDevAttrMaxBlockDimY: *v = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *v = 64; break;
    case cudaDevAttrMaxGridDimX: *v = 2147483647; break;
    case cudaDevAttrMaxGridDimY: case cudaDevAttrMaxGridDimZ: *v = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMultiProcessorCount: *v = SM_COUNT; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = (int)p.sharedMemPerMultiprocessor; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *v = 2048; break;
    case cudaDevAttrL2CacheSize: *v = p.l2CacheSize; break;
    case cudaDevAttrMemoryPoolsSupported: case cudaDevAttrUnifiedAddressing: *v = 1; break;
    case cudaDevAttrPciBusId: *v = p.pciBusID; break;
    case cudaDevAttrMaxRegistersPerBlock: *v = 65536; break;
    case cudaDevAttrClockRate: *v = 1980000; break;
    case cudaDevAttrMemoryClockRate: *v = 2619000; break;
    case cudaDevAttrGlobalMemoryBusWidth: *v = 5120; break;
    case cudaDevAttrConcurrentKernels: case cudaDevAttrCooperativeLaunch: *v = 1; break;
    default: *v = 0; break;
    }
    return cudaSuccess;
}

API cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int d)
{
    T();
    if (d < 0 || d >= device_count())
        return fail(cudaErrorInvalidDevice);
    snprintf(buf, (size_t)len, "00000000:%02X:00.0", 0x10 + d);
    return cudaSuccess;
}

/* Lower number = higher priority; an H100 reports [0, -5] (CUDA 13.0). */
API cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least != NULL)
        *least = 0;
    if (greatest != NULL)
        *greatest = -5;
    return cudaSuccess;
}
API cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int peer) { (void)d; (void)peer; *can = 1; return cudaSuccess; }
API cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) { (void)peer; (void)flags; return cudaSuccess; }

/* ---- memory: copies and memsets complete inside the call (see the header comment) ---- */
API cudaError_t cudaMalloc(void **p, size_t n)
{
    T();
    *p = do_alloc(n, 0);
    return *p != NULL ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
API cudaError_t cudaFree(void *p) { T(); return do_free(p); }
API cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { (void)s; return cudaMalloc(p, n); }
API cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { (void)s; return do_free(p); }
API cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    T();
    (void)flags;
    *p = do_alloc(n, 1);
    return *p != NULL ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
API cudaError_t cudaFreeHost(void *p) { T(); return do_free(p); }
API cudaError_t cudaHostRegister(void *p, size_t n, unsigned int f) { (void)p; (void)n; (void)f; return cudaSuccess; }
API cudaError_t cudaHostUnregister(void *p) { (void)p; return cudaSuccess; }
API cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) { T(); *fr = 79ULL << 30; *tot = 80ULL << 30; return cudaSuccess; }

API cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    (void)k;
    if (n)
        memmove(d, s, n);
    return cudaSuccess;
}
API cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
    (void)st;
    return cudaMemcpy(d, s, n, k);
}
API cudaError_t cudaMemcpyPeerAsync(void *d, int dd, const void *s, int sd, size_t n, cudaStream_t st)
{
    (void)dd; (void)sd; (void)st;
    return cudaMemcpy(d, s, n, cudaMemcpyDefault);
}
API cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                                  enum cudaMemcpyKind k, cudaStream_t st)
{
    (void)k; (void)st;
    for (size_t i = 0; i < h; i++)
        memmove((char *)d + i * dp, (const char *)s + i * sp, w);
    return cudaSuccess;
}
API cudaError_t cudaMemset(void *d, int v, size_t n) { if (n) memset(d, v, n); return cudaSuccess; }
API cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t s) { (void)s; return cudaMemset(d, v, n); }
API cudaError_t cudaMemcpyToSymbol(const void *sym, const void *src, size_t n, size_t off, enum cudaMemcpyKind k)
{
    (void)k;
    memcpy((char *)sym + off, src, n); /* a __device__ variable is its host shadow here */
    return cudaSuccess;
}
API cudaError_t cudaGetSymbolAddress(void **dp, const void *sym) { *dp = (void *)sym; return cudaSuccess; }

API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p)
{
    struct alloc *a = p != NULL ? find_alloc(p, 0) : NULL;
    memset(at, 0, sizeof(*at));
    if (a == NULL) {
        /* CUDA >= 11: an unknown host pointer is cudaMemoryTypeUnregistered, not an error */
        at->type = cudaMemoryTypeUnregistered;
        at->device = -2;
        return cudaSuccess;
    }
    at->type = a->host ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    at->device = a->dev;
    at->devicePointer = (void *)p;
    at->hostPointer = a->host ? (void *)p : NULL;
    return cudaSuccess;
}

/* Memory pools: one default pool per device, attributes read as 0 (torch only queries and trims). */
static int mempool_dummy[64];
API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *mp, int d)
{
    if (d < 0 || d >= device_count() || d >= 64)
        return fail(cudaErrorInvalidDevice);
    *mp = (cudaMemPool_t)&mempool_dummy[d];
    return cudaSuccess;
}
API cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t mp, enum cudaMemPoolAttr a, void *v)
{
    (void)mp; (void)a;
    memset(v, 0, 8); /* the widest attribute is a cuuint64_t */
    return cudaSuccess;
}
API cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t mp, enum cudaMemPoolAttr a, void *v) { (void)mp; (void)a; (void)v; return cudaSuccess; }
API cudaError_t cudaMemPoolSetAccess(cudaMemPool_t mp, const struct cudaMemAccessDesc *d, size_t n) { (void)mp; (void)d; (void)n; return cudaSuccess; }
API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t mp, size_t n) { (void)mp; (void)n; return cudaSuccess; }

/* CUDA IPC: refused; torch falls back (no expandable-segment sharing, no CUDA tensors over multiprocessing). */
API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) { T(); (void)h; (void)p; return fail(cudaErrorNotSupported); }
API cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned int f) { T(); (void)p; (void)h; (void)f; return fail(cudaErrorNotSupported); }
API cudaError_t cudaIpcCloseMemHandle(void *p) { (void)p; return fail(cudaErrorNotSupported); }
API cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e) { T(); (void)h; (void)e; return fail(cudaErrorNotSupported); }
API cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t h) { T(); (void)e; (void)h; return fail(cudaErrorNotSupported); }

/* ---- streams: handles with a device and priority; always idle ---- */
#define STREAM_MAGIC 0x5354524d5457494eULL
struct twin_stream { uint64_t magic; int dev; int prio; unsigned flags; };

/* Legacy (0) and per-thread (2) default streams are small constants, not objects (driver_types.h). */
static struct twin_stream *stream_of(cudaStream_t s)
{
    struct twin_stream *f = (struct twin_stream *)s;
    return (uintptr_t)f > 16 && f->magic == STREAM_MAGIC ? f : NULL;
}
static cudaError_t new_stream(cudaStream_t *s, unsigned flags, int prio)
{
    struct twin_stream *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return fail(cudaErrorMemoryAllocation);
    *f = (struct twin_stream){ STREAM_MAGIC, cur_dev, prio, flags };
    *s = (cudaStream_t)f;
    return cudaSuccess;
}
API cudaError_t cudaStreamCreate(cudaStream_t *s) { T(); return new_stream(s, 0, 0); }
API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int f, int prio) { T(); return new_stream(s, f, prio); }
API cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    struct twin_stream *f = stream_of(s);
    T();
    if (f != NULL) {
        f->magic = 0;
        free(f);
    }
    return cudaSuccess;
}
API cudaError_t cudaStreamGetPriority(cudaStream_t s, int *prio)
{
    struct twin_stream *f = stream_of(s);
    *prio = f != NULL ? f->prio : 0;
    return cudaSuccess;
}
API cudaError_t cudaStreamQuery(cudaStream_t s) { (void)s; return cudaSuccess; }
API cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return cudaSuccess; }
API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) { (void)s; (void)e; (void)f; return cudaSuccess; }
/* Host callbacks run once prior work is done: at once here, on the caller's thread (a GPU runs them on a
 * runtime thread later). */
API cudaError_t cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t cb, void *ud, unsigned int f)
{
    T();
    (void)f;
    cb(s, cudaSuccess, ud);
    return cudaSuccess;
}
API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *ud) { T(); (void)s; fn(ud); return cudaSuccess; }

/* ---- capture and graphs: never capturing; instantiating a graph is refused ---- */
API cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st)
{
    (void)s;
    *st = cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, enum cudaStreamCaptureStatus *st, unsigned long long *id,
                                         cudaGraph_t *g, const cudaGraphNode_t **deps, const cudaGraphEdgeData **ed,
                                         size_t *nd)
{
    (void)s;
    if (st != NULL) *st = cudaStreamCaptureStatusNone;
    if (id != NULL) *id = 0;
    if (g != NULL) *g = NULL;
    if (deps != NULL) *deps = NULL;
    if (ed != NULL) *ed = NULL;
    if (nd != NULL) *nd = 0;
    return cudaSuccess;
}
API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m) { (void)m; return cudaSuccess; }
API cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode m) { T(); (void)s; (void)m; return fail(cudaErrorNotSupported); }
API cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) { T(); (void)s; (void)g; return fail(cudaErrorNotSupported); }
API cudaError_t cudaGraphDestroy(cudaGraph_t g) { (void)g; return cudaSuccess; }
API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t g) { (void)g; return cudaSuccess; }
API cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *n, size_t *nn) { (void)g; (void)n; if (nn != NULL) *nn = 0; return cudaSuccess; }
API cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t n, cudaGraphNode_t *d, cudaGraphEdgeData *e, size_t *nd)
{
    (void)n; (void)d; (void)e;
    if (nd != NULL) *nd = 0;
    return cudaSuccess;
}
API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long f) { (void)e; (void)g; (void)f; return fail(cudaErrorNotSupported); }
API cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) { (void)e; (void)s; return fail(cudaErrorNotSupported); }
API cudaError_t cudaGraphDebugDotPrint(cudaGraph_t g, const char *p, unsigned int f) { (void)g; (void)p; (void)f; return fail(cudaErrorNotSupported); }

/* ---- events: complete at once; their time is the host time of cudaEventRecord ---- */
#define EVENT_MAGIC 0x45564e545457494eULL
struct twin_event { uint64_t magic; double t_ms; unsigned flags; };

API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int f)
{
    struct twin_event *ev = calloc(1, sizeof(*ev));
    if (ev == NULL)
        return fail(cudaErrorMemoryAllocation);
    *ev = (struct twin_event){ EVENT_MAGIC, now_ms(), f };
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}
API cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
API cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    struct twin_event *ev = (struct twin_event *)e;
    if (ev != NULL && ev->magic == EVENT_MAGIC) {
        ev->magic = 0;
        free(ev);
    }
    return cudaSuccess;
}
API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    struct twin_event *ev = (struct twin_event *)e;
    (void)s;
    if (ev != NULL)
        ev->t_ms = now_ms();
    return cudaSuccess;
}
API cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int f) { (void)f; return cudaEventRecord(e, s); }
API cudaError_t cudaEventQuery(cudaEvent_t e) { (void)e; return cudaSuccess; }
API cudaError_t cudaEventSynchronize(cudaEvent_t e) { (void)e; return cudaSuccess; }
API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    struct twin_event *x = (struct twin_event *)a, *y = (struct twin_event *)b;
    if (x == NULL || y == NULL)
        return fail(cudaErrorInvalidResourceHandle);
    /* cudaEventDisableTiming events cannot be timed (cuda_runtime_api.h 13.0, cudaEventElapsedTime) */
    if ((x->flags | y->flags) & cudaEventDisableTiming)
        return fail(cudaErrorInvalidResourceHandle);
    *ms = (float)(y->t_ms - x->t_ms);
    return cudaSuccess;
}

/* ---- kernels: launch configuration kept as nvcc's generated stubs expect; launches are counted ---- */
struct launch_cfg { dim3 g, b; size_t shm; void *st; };
static __thread struct launch_cfg cfg_stack[16];
static __thread int cfg_top;
static long n_launch;

API unsigned __cudaPushCallConfiguration(dim3 g, dim3 b, size_t shm, struct CUstream_st *st)
{
    if (cfg_top < 16)
        cfg_stack[cfg_top] = (struct launch_cfg){ g, b, shm, st };
    cfg_top++;
    return 0;
}
API cudaError_t __cudaPopCallConfiguration(dim3 *g, dim3 *b, size_t *shm, void *st)
{
    if (cfg_top <= 0)
        return fail(cudaErrorInvalidConfiguration);
    if (--cfg_top < 16) {
        *g = cfg_stack[cfg_top].g;
        *b = cfg_stack[cfg_top].b;
        *shm = cfg_stack[cfg_top].shm;
        *(void **)st = cfg_stack[cfg_top].st;
    }
    return cudaSuccess;
}
static cudaError_t count_launch(void)
{
    __atomic_add_fetch(&n_launch, 1, __ATOMIC_RELAXED);
    return cudaSuccess;
}
API cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *fun) { *k = (cudaKernel_t)fun; return cudaSuccess; }
API cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t st)
{
    (void)k; (void)g; (void)b; (void)args; (void)shm; (void)st;
    return count_launch();
}
API cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t st)
{
    (void)f; (void)g; (void)b; (void)args; (void)shm; (void)st;
    return count_launch();
}
API cudaError_t cudaLaunchCooperativeKernel(const void *f, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t st)
{
    return cudaLaunchKernel(f, g, b, args, shm, st);
}
API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *f, void **args)
{
    (void)c; (void)f; (void)args;
    return count_launch();
}
API cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *f)
{
    (void)f;
    memset(a, 0, sizeof(*a));
    a->maxThreadsPerBlock = 1024;
    a->numRegs = 32;
    a->ptxVersion = 90;
    a->binaryVersion = 90;
    a->maxDynamicSharedSizeBytes = 48 << 10;
    return cudaSuccess;
}
API cudaError_t cudaFuncSetAttribute(const void *f, enum cudaFuncAttribute a, int v) { (void)f; (void)a; (void)v; return cudaSuccess; }
API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *nb, const void *f, int bs, size_t shm,
                                                                       unsigned int fl)
{
    (void)f; (void)shm; (void)fl;
    *nb = bs > 0 ? 2048 / bs : 1;
    *nb = *nb > 32 ? 32 : *nb < 1 ? 1 : *nb;
    return cudaSuccess;
}
API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *nb, const void *f, int bs, size_t shm)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(nb, f, bs, shm, 0);
}

/* Registration of the fat binaries nvcc embeds in libtorch_cuda: accepted and ignored (no code is loaded). */
static void *fatbin_handles[4];
API void **__cudaRegisterFatBinary(void *fc) { (void)fc; return fatbin_handles; }
API void __cudaRegisterFatBinaryEnd(void **h) { (void)h; }
API void __cudaUnregisterFatBinary(void **h) { (void)h; }
API char __cudaInitModule(void **h) { (void)h; return 1; }
API void __cudaRegisterFunction(void **h, const char *hf, char *df, const char *dn, int tl, uint3 *tid, uint3 *bid,
                                dim3 *bd, dim3 *gd, int *ws)
{
    (void)h; (void)hf; (void)df; (void)dn; (void)tl; (void)tid; (void)bid; (void)bd; (void)gd; (void)ws;
}
API void __cudaRegisterVar(void **h, char *hv, char *da, const char *dn, int ext, size_t sz, int c, int g)
{
    (void)h; (void)hv; (void)da; (void)dn; (void)ext; (void)sz; (void)c; (void)g;
}

/* Driver entry points: none (no libcuda); torch then skips what needs them (expandable segments, NVLS). */
API cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fp, unsigned int ver, unsigned long long fl,
                                                 enum cudaDriverEntryPointQueryResult *st)
{
    (void)fl;
    if (trace_on > 0)
        fprintf(stderr, "[twin cudart %d] cudaGetDriverEntryPointByVersion(%s, %u): not found\n", (int)getpid(), sym, ver);
    *fp = NULL;
    if (st != NULL)
        *st = cudaDriverEntryPointSymbolNotFound;
    return fail(cudaErrorSymbolNotFound);
}

API cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
API cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

__attribute__((destructor)) static void report_launches(void)
{
    if (trace_on > 0)
        fprintf(stderr, "[twin cudart %d] kernel launches: %ld\n", (int)getpid(), n_launch);
}
