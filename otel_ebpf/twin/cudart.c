/*
 * Stand-in libcudart.so.13 for the twin (otel_ebpf/twin, docs/twin.md): lets the real PyTorch CUDA wheel
 * run on a machine with no GPU.  Not NVIDIA's library.
 *
 * Prototypes: compiled against the real CUDA 13.0 `cuda_runtime_api.h` (the nvidia-cuda-runtime 13.0.96
 * wheel torch 2.11.0's cuda-toolkit 13.0.2 pins; scripts/setup.sh extracts its headers), so every exported
 * function has the real signature, and exported under the `libcudart.so.13` version node as the real
 * library does (torch imports `cudaMalloc@libcudart.so.13`).  Exports are what torch 2.11.0 imports, plus the
 * functions a tracer of the real runtime probes (cudaMallocManaged, cudaStreamCreateWithFlags).
 *
 * Model (what is the same as on a GPU):
 * - N devices (OTEL_EBPF_TWIN_GPUS, default 2), per-thread current device (cudaSetDevice is per host thread:
 *   CUDA Runtime API 13.0, "Device Management").  Out-of-range devices give cudaErrorInvalidDevice.
 * - Device memory is real, addressable memory: copies and memsets move the bytes, so every host-visible
 *   value (tensor.cpu(), NCCL results) is real data.
 * - Sticky "last error" per thread: cudaGetLastError returns and resets, cudaPeekAtLastError only returns.
 * - Streams are FIFO queues, each drained by its own worker thread (CUDA Programming Guide 13.0, "Streams"):
 *   cudaMemcpyAsync, cudaMemsetAsync, cudaEventRecord, host functions and NCCL's work (__cudaTwinLaunch)
 *   run in call order on their stream, after the calls return.  cudaStreamWaitEvent makes a stream wait for
 *   the work an event captured; cudaStreamQuery/cudaEventQuery say cudaErrorNotReady while work is pending;
 *   cudaStreamSynchronize, cudaEventSynchronize and cudaDeviceSynchronize block until it is done.  An event's
 *   time is the host time at which its stream reached it (as a GPU timestamps it when the stream does).
 * - The legacy default stream (0, cudaStreamLegacy) waits for prior work on every blocking stream of its
 *   device, and blocking streams wait for it; streams made with cudaStreamNonBlocking do not (CUDA Runtime
 *   API 13.0, "Stream synchronization behavior").  cudaStreamPerThread is a blocking stream per host thread.
 * - Host synchronisation of copies as the CUDA Runtime API 13.0 "API synchronization behavior" page says:
 *   cudaMemcpy returns once done, except device to device; cudaMemcpyAsync to or from pageable host memory
 *   (memory cudaHostAlloc did not make and cudaHostRegister did not register) returns once done; cudaMemset
 *   on device memory does not wait; cudaFree and cudaFreeHost wait for all work first.
 * What differs from a GPU (said in docs/twin.md):
 * - Device memory is host memory (the model's one big simplification): kernels are never run, they are
 *   counted and do nothing, so values a kernel would compute are left as they were.  A kernel launch takes
 *   no stream time (only copies, memsets, host functions and NCCL's work occupy a stream), unless the
 *   process sets OTEL_EBPF_TWIN_KERNEL_US before its first launch: then every launch occupies its stream that
 *   many microseconds (a rank with a slow GPU; read once, cudart_kernels.c).
 * - Work on an idle stream whose dependencies are met runs inside the call, on the calling thread (the same
 *   observable order; no thread hand-off for the common case).
 * - Stream capture and graphs are modelled (cudart_capture.c, cudart_graphs.c): captured work becomes graph
 *   nodes, a graph launch runs them in capture order on its stream.  CUDA IPC and driver entry points are
 *   refused (cudaErrorNotSupported / cudaErrorSymbolNotFound), which torch handles as "not available".
 * - A stream's worker thread, once started, lives until the process exits; a destroyed stream's struct is
 *   kept (events may still point at it).  Streams are not safe across fork(), as CUDA contexts are not.
 *
 * Env: OTEL_EBPF_TWIN_STATS=DIR (each process writes DIR/cudart-<pid>.txt at exit: its kernel launch count),
 * OTEL_EBPF_TWIN_GPUS=N, OTEL_EBPF_TWIN_NODE=k (the node index: devices' UUIDs and PCI domains differ
 * per node, as GPUs of different machines do), OTEL_EBPF_TWIN_TRACE=1 (log calls to stderr).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cudart_twin.h"

#define SM_COUNT 132 /* the properties are an H100 SXM's (CUDA 13.0 deviceQuery on one) */

int twin_tracing(void)
{
    static int on = -1;
    if (on < 0) {
        const char *s = getenv("OTEL_EBPF_TWIN_TRACE");
        on = s != NULL && *s != '\0' && *s != '0';
    }
    return on;
}

void twin_trace(const char *fn)
{
    if (twin_tracing())
        fprintf(stderr, "[twin cudart %d] %s\n", (int)getpid(), fn);
}

static int device_count(void)
{
    const char *s = getenv("OTEL_EBPF_TWIN_GPUS");
    int n = s != NULL ? atoi(s) : 2;
    return n < 0 ? 0 : n;
}

/* OTEL_EBPF_TWIN_NODE: which node of a twin cluster this process runs on (otel_ebpf/twin/cluster.py). */
static int node_index(void)
{
    const char *s = getenv("OTEL_EBPF_TWIN_NODE");
    return s != NULL ? atoi(s) : 0;
}

__thread int cur_dev;
static __thread cudaError_t last_err = cudaSuccess;

/* Records a failure as the real runtime does: returned now and kept for cudaGetLastError. */
cudaError_t fail(cudaError_t e)
{
    last_err = e;
    return e;
}

/* ---- allocations: a registry so cudaPointerGetAttributes can answer, as UVA does ---- */
/* host: cudaHostAlloc'd or cudaHostRegister'ed (pinned); owned: ours to unmap (not a registered range) */
struct alloc { void *p; size_t n; int dev; int host; int owned; struct alloc *next; };
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
    *a = (struct alloc){ p, len, cur_dev, host, 1, NULL };
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

cudaError_t do_free(void *p)
{
    struct alloc *a;
    if (p == NULL)
        return cudaSuccess; /* cudaFree(NULL) is a no-op (cuda_runtime_api.h 13.0, cudaFree) */
    a = find_alloc(p, 1);
    if (a == NULL)
        return fail(cudaErrorInvalidValue);
    if (a->owned)
        munmap(a->p, a->n);
    free(a);
    return cudaSuccess;
}

double now_ms(void)
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
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorOperatingSystem: return "cudaErrorOperatingSystem";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
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

API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    T();
    if (d < 0 || d >= device_count())
        return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "otel-ebpf twin GPU %d (no GPU)", d);
    /* distinct per device and per node, as NCCL's topology and NVML-keyed tools want; PCI bus ids repeat
     * across nodes, as on identical real machines */
    for (int i = 0; i < 16; i++)
        p->uuid.bytes[i] = (char)(0x40 + d * 16 + i);
    memcpy(p->uuid.bytes, &(uint32_t){ 0x6e696e74u ^ (uint32_t)node_index() }, 4);
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

/* ---- memory ---- */
/* cudaMalloc, cudaMallocManaged, cudaHostAlloc, cudaFree and cudaFreeHost are "potentially unsafe" during a
 * capture: refused as the thread's capture mode says (cudart_capture.c capture_unsafe_call; torch 2.11's
 * CUDACachingAllocator cudaMallocMaybeCapturing switches to cudaStreamCaptureModeRelaxed around its cudaMalloc). */
API cudaError_t cudaMalloc(void **p, size_t n)
{
    cudaError_t rc;
    T();
    if ((rc = capture_unsafe_call()) != cudaSuccess)
        return rc;
    *p = do_alloc(n, 0);
    return *p != NULL ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
/* cudaFree and cudaFreeHost synchronise the device first (CUDA Runtime API 13.0, "API synchronization
 * behavior"); here every stream of the process, since a buffer may be in use on any of them. */
API cudaError_t cudaFree(void *p)
{
    cudaError_t rc;
    T();
    if ((rc = capture_unsafe_call()) != cudaSuccess)
        return rc;
    if (p != NULL)
        drain(-1, 0, NULL);
    return do_free(p);
}
/* Not stream-ordered here: the memory is mapped at once (not a graph allocation node when captured: torch's
 * default allocator does not call it). */
API cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s)
{
    (void)s;
    *p = do_alloc(n, 0);
    return *p != NULL ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
/* Managed memory is addressable from host and device: here all device memory is. torch does not import it; it is
 * exported because the real runtime does and tracers probe it (the cuda receiver does). */
API cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int flags)
{
    cudaError_t rc;
    T();
    (void)flags;
    if ((rc = capture_unsafe_call()) != cudaSuccess)
        return rc;
    *p = do_alloc(n, 0);
    return *p != NULL ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
API cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    struct op *o;
    if (p == NULL)
        return cudaSuccess;
    if ((o = new_op(OP_FREE)) == NULL)
        return fail(cudaErrorMemoryAllocation);
    o->u.free.p = p;
    return submit(s, o, 1, 0);
}
API cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    cudaError_t rc;
    T();
    (void)flags;
    if ((rc = capture_unsafe_call()) != cudaSuccess)
        return rc;
    *p = do_alloc(n, 1);
    return *p != NULL ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
API cudaError_t cudaFreeHost(void *p)
{
    cudaError_t rc;
    T();
    if ((rc = capture_unsafe_call()) != cudaSuccess)
        return rc;
    if (p != NULL)
        drain(-1, 0, NULL);
    return do_free(p);
}
/* A registered range is pinned: copies to and from it no longer wait (see the header comment). */
API cudaError_t cudaHostRegister(void *p, size_t n, unsigned int f)
{
    struct alloc *a = malloc(sizeof(*a));
    (void)f;
    if (a == NULL)
        return fail(cudaErrorMemoryAllocation);
    *a = (struct alloc){ p, n ? n : 1, cur_dev, 1, 0, NULL };
    pthread_mutex_lock(&alloc_mu);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&alloc_mu);
    return cudaSuccess;
}
API cudaError_t cudaHostUnregister(void *p)
{
    struct alloc *a = find_alloc(p, 0);
    if (a == NULL || a->owned || a->p != p)
        return fail(cudaErrorHostMemoryNotRegistered);
    free(find_alloc(p, 1));
    return cudaSuccess;
}
API cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) { T(); *fr = 79ULL << 30; *tot = 80ULL << 30; return cudaSuccess; }

/* Pageable: host memory the runtime neither allocated nor registered. */
static int pageable(const void *p) { return find_alloc(p, 0) == NULL; }
static int on_device(const void *p)
{
    struct alloc *a = find_alloc(p, 0);
    return a != NULL && !a->host;
}

static cudaError_t copy_op(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, cudaStream_t st,
                           int host_wait)
{
    struct op *o = new_op(OP_COPY);
    if (o == NULL)
        return fail(cudaErrorMemoryAllocation);
    o->u.copy.d = d;
    o->u.copy.s = s;
    o->u.copy.w = w;
    o->u.copy.h = h;
    o->u.copy.dp = dp;
    o->u.copy.sp = sp;
    return submit(st, o, 1, host_wait);
}

/* Synchronous cudaMemcpy: on the legacy stream, returning once done unless device to device. */
API cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    (void)k;
    TWIN_COUNT(TWIN_COPIES);
    return copy_op(d, n, s, n, n, 1, NULL, !(on_device(d) && on_device(s)));
}
API cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st)
{
    (void)k;
    TWIN_COUNT(TWIN_COPIES);
    return copy_op(d, n, s, n, n, 1, st, n > 0 && (pageable(d) || pageable(s)));
}
API cudaError_t cudaMemcpyPeerAsync(void *d, int dd, const void *s, int sd, size_t n, cudaStream_t st)
{
    (void)dd; (void)sd;
    return copy_op(d, n, s, n, n, 1, st, 0);
}
API cudaError_t cudaMemcpy2DAsync(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h,
                                  enum cudaMemcpyKind k, cudaStream_t st)
{
    (void)k;
    return copy_op(d, dp, s, sp, w, h, st, w > 0 && h > 0 && (pageable(d) || pageable(s)));
}
static cudaError_t set_op(void *d, int v, size_t n, cudaStream_t st, int host_wait)
{
    struct op *o = new_op(OP_SET);
    if (o == NULL)
        return fail(cudaErrorMemoryAllocation);
    o->u.set.d = d;
    o->u.set.v = v;
    o->u.set.n = n;
    return submit(st, o, 1, host_wait);
}
/* cudaMemset waits only when its target is not device memory ("API synchronization behavior", Memset). */
API cudaError_t cudaMemset(void *d, int v, size_t n) { TWIN_COUNT(TWIN_MEMSETS); return set_op(d, v, n, NULL, !on_device(d)); }
API cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t s) { TWIN_COUNT(TWIN_MEMSETS); return set_op(d, v, n, s, 0); }
/* A __device__ variable is its host shadow here; the copy is a synchronous one on the legacy stream. */
API cudaError_t cudaMemcpyToSymbol(const void *sym, const void *src, size_t n, size_t off, enum cudaMemcpyKind k)
{
    (void)k;
    return copy_op((char *)sym + off, n, src, n, n, 1, NULL, 1);
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

