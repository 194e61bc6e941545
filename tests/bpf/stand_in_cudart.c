/*
 * stand_in_cudart: a libcudart.so.12 whose calls SUCCEED (return 0), for the probe tests of
 * what the real library cannot show without a GPU (it returns 35 from every call): a
 * committed cudaSetDevice binding, pointers written back by cudaMalloc*, and frees that
 * match them.  tests/support/cuda_driver loads it like the real one (dlopen of its path).
 *
 * Known values: the n-th allocation (0-based, any cudaMalloc* variant) returns
 * STAND_IN_PTR_BASE + n * STAND_IN_PTR_STEP.  Every function returns 0 (cudaSuccess).
 * Launches, graph replays, cudaMalloc and cudaFree go through a libcuda.so.1 when one loads (below, "The
 * driver"); cudaMalloc then returns the driver's pointer.
 * Built by tests/bpf/test_cuda_receiver.py (gcc -O1 -fPIC -shared, soname libcudart.so.12).
 */
#include <dlfcn.h>
#include <stddef.h>

#define STAND_IN_PTR_BASE 0x7f5a00000000UL
#define STAND_IN_PTR_STEP 0x100000UL

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef struct { unsigned int x, y, z; } dim3;

static unsigned long allocations;
static __thread int current_device;  /* CUDA's current device is per host thread, 0 until set */

static cudaError_t give(void **p)
{
    *p = (void *)(STAND_IN_PTR_BASE + allocations++ * STAND_IN_PTR_STEP);
    return 0;
}

cudaError_t cudaSetDevice(int device) { current_device = device; return 0; }
cudaError_t cudaGetDevice(int *device)
{
    if (device == NULL)
        return 1;  /* cudaErrorInvalidValue */
    *device = current_device;
    return 0;
}
static int driver_alloc(void **p, size_t n, int *rc);
static int driver_free(void *p, int *rc);
cudaError_t cudaMalloc(void **p, size_t n)
{
    int rc;
    if (driver_alloc(p, n, &rc))  /* through the driver's cuMemAlloc_v2 when one loads, as libcudart 12 */
        return rc;
    return give(p);
}
cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int f) { (void)n; (void)f; return give(p); }
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { (void)n; (void)s; return give(p); }
static int driver_copy(void *d, const void *s, size_t n, cudaStream_t st, int async, int *rc);
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, int k)
{
    int rc;
    (void)k;
    if (driver_copy(d, s, n, NULL, 0, &rc))  /* through the driver's cuMemcpy when one loads */
        return rc;
    return 0;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, int k, cudaStream_t st)
{
    int rc;
    (void)k;
    if (driver_copy(d, s, n, st, 1, &rc))  /* through the driver's cuMemcpyAsync when one loads */
        return rc;
    return 0;
}
/* The driver, when a libcuda.so.1 can be loaded (tests/bpf/stand_in_cuda.c): launches and graph replays go
 * through it, resolved with cuGetProcAddress_v2 as libcudart 12 resolves its driver calls (its strings name
 * cuGetProcAddress_v2 and each cu* entry; it does not link libcuda).  Without one every call succeeds here
 * (the real runtime would return 35). */
typedef int (*drv_launch_t)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            cudaStream_t, void **, void **);
typedef int (*drv_launch_ex_t)(const void *, const void *, void **, void **);
typedef int (*drv_graph_t)(void *, cudaStream_t);
typedef int (*drv_proc_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*drv_alloc_t)(unsigned long long *, size_t);
typedef int (*drv_free_t)(unsigned long long);
typedef int (*drv_copy_t)(unsigned long long, unsigned long long, size_t);
typedef int (*drv_copy_async_t)(unsigned long long, unsigned long long, size_t, cudaStream_t);
/* cuMemcpy / cuMemcpyAsync: libcudart 12's strings name them (and the typed copies); which ones its cudaMemcpy*
 * really calls is not visible from outside, and the probe tests need only that a runtime copy enters the driver */
static drv_copy_t drv_copy;
static drv_copy_async_t drv_copy_async;
static drv_alloc_t drv_alloc;  /* cuMemAlloc_v2 / cuMemFree_v2: libcudart 12's strings name them */
static drv_free_t drv_free;
static drv_launch_t drv_launch;
static drv_launch_ex_t drv_launch_ex;
static drv_graph_t drv_graph;
static int drv_state;  /* 0 not tried, 1 bound, -1 none */

static int driver(void)
{
    if (drv_state == 0) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        drv_proc_t proc = lib ? (drv_proc_t)dlsym(lib, "cuGetProcAddress_v2") : NULL;
        drv_state = -1;
        if (proc != NULL && proc("cuLaunchKernel", (void **)&drv_launch, 12000, 0, NULL) == 0 &&
            proc("cuLaunchKernelEx", (void **)&drv_launch_ex, 12000, 0, NULL) == 0 &&
            proc("cuGraphLaunch", (void **)&drv_graph, 12000, 0, NULL) == 0)
            drv_state = 1;
        if (drv_state == 1 && (proc("cuMemAlloc", (void **)&drv_alloc, 12000, 0, NULL) != 0 ||
                               proc("cuMemFree", (void **)&drv_free, 12000, 0, NULL) != 0))
            drv_alloc = NULL, drv_free = NULL;
        if (drv_state == 1 && (proc("cuMemcpy", (void **)&drv_copy, 12000, 0, NULL) != 0 ||
                               proc("cuMemcpyAsync", (void **)&drv_copy_async, 12000, 0, NULL) != 0))
            drv_copy = NULL, drv_copy_async = NULL;
    }
    return drv_state == 1;
}

/* cudaErrorMemoryAllocation (2) for any driver failure: enough for the probe tests */
static int driver_alloc(void **p, size_t n, int *rc)
{
    unsigned long long d = 0;
    if (!driver() || drv_alloc == NULL)
        return 0;
    *rc = drv_alloc(&d, n) == 0 ? 0 : 2;
    if (*rc == 0)
        *p = (void *)d;
    return 1;
}

static int driver_free(void *p, int *rc)
{
    if (!driver() || drv_free == NULL)
        return 0;
    *rc = p == NULL || drv_free((unsigned long long)p) == 0 ? 0 : 1;  /* cudaFree(NULL) does nothing */
    return 1;
}

/* cudaErrorInvalidValue (1) for any driver failure */
static int driver_copy(void *d, const void *s, size_t n, cudaStream_t st, int async, int *rc)
{
    if (!driver() || drv_copy == NULL)
        return 0;
    unsigned long long dst = (unsigned long long)d, src = (unsigned long long)s;
    *rc = (async ? drv_copy_async(dst, src, n, st) : drv_copy(dst, src, n)) == 0 ? 0 : 1;
    return 1;
}

cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, size_t sm, cudaStream_t s)
{
    if (driver())  /* the host stub stands for its CUfunction */
        return drv_launch(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)sm, s, a, NULL) == 0 ? 0 : 999;
    return 0;
}
/* cudaLaunchConfig_t (grid@0 block@12 dynamicSmemBytes@24 stream@32) -> CUlaunchConfig (smem as unsigned) */
struct rt_cfg { dim3 g, b; size_t smem; cudaStream_t s; void *attrs; unsigned n; };
struct drv_cfg { dim3 g, b; unsigned smem; cudaStream_t s; void *attrs; unsigned n; };
cudaError_t cudaLaunchKernelExC(const void *cfg, const void *f, void **a)
{
    if (driver()) {
        const struct rt_cfg *c = cfg;
        struct drv_cfg d = { c->g, c->b, (unsigned)c->smem, c->s, NULL, 0 };
        return drv_launch_ex(&d, f, a, NULL) == 0 ? 0 : 999;
    }
    return 0;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return 0; }
cudaError_t cudaDeviceSynchronize(void) { return 0; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { (void)e; return 0; }
cudaError_t cudaFree(void *p)
{
    int rc;
    return driver_free(p, &rc) ? rc : 0;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { (void)p; (void)s; return 0; }
/* Counted-only calls (receivers/cuda: count_return). Each is its own function calling no other exported
 * entry, as in the real libcudart.so.12 (objdump of nvidia-cuda-runtime-cu12 12.x: none of these calls or
 * jumps into another probed entry), so one call is one probe hit. */
cudaError_t cudaMemset(void *d, int v, size_t n) { (void)d; (void)v; (void)n; return 0; }
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t s) { (void)d; (void)v; (void)n; (void)s; return 0; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { (void)e; (void)s; return 0; }
cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int f)
{
    (void)e; (void)s; (void)f;
    return 0;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) { (void)s; (void)e; (void)f; return 0; }
cudaError_t cudaStreamCreate(cudaStream_t *s) { *s = (cudaStream_t)0x5100; return 0; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int f) { (void)f; *s = (cudaStream_t)0x5101; return 0; }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int f, int prio)
{
    (void)f; (void)prio;
    *s = (cudaStream_t)0x5102;
    return 0;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { (void)s; return 0; }
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = (cudaEvent_t)0x5200; return 0; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int f) { (void)f; *e = (cudaEvent_t)0x5201; return 0; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { (void)e; return 0; }
cudaError_t cudaHostRegister(void *p, size_t n, unsigned int f) { (void)p; (void)n; (void)f; return 0; }
cudaError_t cudaHostUnregister(void *p) { (void)p; return 0; }
/* A replay of an instantiated graph (cuda_runtime_api.h: cudaGraphLaunch(cudaGraphExec_t, cudaStream_t)) */
static volatile unsigned long graph_replays;
cudaError_t cudaGraphLaunch(void *exec, cudaStream_t s)
{
    graph_replays++;
    if (driver())
        return drv_graph(exec, s) == 0 ? 0 : 999;
    return 0;
}
/* Stream capture, as the CUDA Runtime API 13.0 documents cudaStreamBeginCapture / cudaStreamEndCapture: capture
 * cannot begin on the legacy stream (NULL or cudaStreamLegacy 0x1: cudaErrorStreamCaptureUnsupported 900) nor on
 * a stream already capturing (cudaErrorIllegalState 401); ending a stream that is not capturing is
 * cudaErrorIllegalState; a successful end hands back a graph (a made-up handle here). Up to 8 streams at once. */
typedef void *cudaGraph_t;
static cudaStream_t capturing[8];
static cudaError_t begin_capture(cudaStream_t s)
{
    int free_slot = -1;
    if (s == NULL || s == (cudaStream_t)0x1)
        return 900;
    for (int i = 0; i < 8; i++) {
        if (capturing[i] == s)
            return 401;
        if (capturing[i] == NULL && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0)
        return 2; /* cudaErrorMemoryAllocation */
    capturing[free_slot] = s;
    return 0;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode) { (void)mode; return begin_capture(s); }
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    for (int i = 0; i < 8; i++)
        if (s != NULL && capturing[i] == s) {
            capturing[i] = NULL;
            *g = (cudaGraph_t)0x6a00;
            return 0;
        }
    return 401;
}
