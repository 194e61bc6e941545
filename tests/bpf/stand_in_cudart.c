/*
 * stand_in_cudart: a libcudart.so.12 whose calls SUCCEED (return 0), for the probe tests of
 * what the real library cannot show without a GPU (it returns 35 from every call): a
 * committed cudaSetDevice binding, pointers written back by cudaMalloc*, and frees that
 * match them.  tests/support/cuda_driver loads it like the real one (dlopen of its path).
 *
 * Known values: the n-th allocation (0-based, any cudaMalloc* variant) returns
 * STAND_IN_PTR_BASE + n * STAND_IN_PTR_STEP.  Every function returns 0 (cudaSuccess).
 * Built by tests/bpf/test_cuda_receiver.py (gcc -O1 -fPIC -shared, soname libcudart.so.12).
 */
#include <stddef.h>

#define STAND_IN_PTR_BASE 0x7f5a00000000UL
#define STAND_IN_PTR_STEP 0x100000UL

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef struct { unsigned int x, y, z; } dim3;

static unsigned long allocations;
static volatile int current_device;

static cudaError_t give(void **p)
{
    *p = (void *)(STAND_IN_PTR_BASE + allocations++ * STAND_IN_PTR_STEP);
    return 0;
}

cudaError_t cudaSetDevice(int device) { current_device = device; return 0; }
cudaError_t cudaMalloc(void **p, size_t n) { (void)n; return give(p); }
cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int f) { (void)n; (void)f; return give(p); }
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { (void)n; (void)s; return give(p); }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, int k) { (void)d; (void)s; (void)n; (void)k; return 0; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, int k, cudaStream_t st)
{
    (void)d; (void)s; (void)n; (void)k; (void)st;
    return 0;
}
cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, size_t sm, cudaStream_t s)
{
    (void)f; (void)g; (void)b; (void)a; (void)sm; (void)s;
    return 0;
}
cudaError_t cudaLaunchKernelExC(const void *cfg, const void *f, void **a) { (void)cfg; (void)f; (void)a; return 0; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return 0; }
cudaError_t cudaDeviceSynchronize(void) { return 0; }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { (void)e; return 0; }
cudaError_t cudaFree(void *p) { (void)p; return 0; }
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { (void)p; (void)s; return 0; }
/* A replay of an instantiated graph (cuda_runtime_api.h: cudaGraphLaunch(cudaGraphExec_t, cudaStream_t)) */
static volatile unsigned long graph_replays;
cudaError_t cudaGraphLaunch(void *exec, cudaStream_t s) { (void)exec; (void)s; graph_replays++; return 0; }
