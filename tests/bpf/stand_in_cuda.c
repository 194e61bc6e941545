/*
 * stand_in_cuda: a libcuda.so.1 (the CUDA driver API) whose launches SUCCEED, for the driver-API probe tests
 * (tests/bpf/test_cuda_driver.py); NOT NVIDIA's library.  Prototypes from the cuda.h of the
 * nvidia-cuda-runtime-cu12 wheel (CUDA 12.9), built with -I to its include directory.
 *
 * What it follows of the real driver:
 *   - cuGetProcAddress_v2 (cuda.h, CUDA 12.x: "cuGetProcAddress" is #defined to it) returns the address of the
 *     exported entry point for `symbol`, the _ptsz variant when CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM is
 *     in `flags`, as libcudart 12 resolves its driver calls (its strings hold cuGetProcAddress_v2 and the
 *     driver names, not a link to libcuda).  So a uprobe on cuLaunchKernel sees the runtime's own launches.
 *   - cuLaunchKernel / cuLaunchKernelEx / cuGraphLaunch (+ _ptsz) take cuda.h's arguments and return
 *     CUDA_SUCCESS; nothing runs.  Each is its own function (no exported entry calls another).
 *   - cuInit and cuDriverGetVersion (12090).
 * Launch counts are printed at exit to stderr when STAND_IN_CUDA_TRACE=1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#define API __attribute__((visibility("default"), noinline))

static long launches;

API CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
API CUresult cuDriverGetVersion(int *v)
{
    if (v == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, const void *grid_and_block)
{
    if (f == NULL || grid_and_block == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                            unsigned int by, unsigned int bz, unsigned int smem, CUstream s, void **params,
                            void **extra)
{
    unsigned int dims[6] = { gx, gy, gz, bx, by, bz };
    (void)smem; (void)s; (void)params; (void)extra;
    return launch(f, dims);
}
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                 unsigned int by, unsigned int bz, unsigned int smem, CUstream s, void **params,
                                 void **extra)
{
    unsigned int dims[6] = { gx, gy, gz, bx, by, bz };
    (void)smem; (void)s; (void)params; (void)extra;
    return launch(f, dims);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    (void)params; (void)extra;
    return launch(f, config);
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    (void)params; (void)extra;
    return launch(f, config);
}
API CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) { (void)s; return exec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
API CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) { (void)s; return exec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

static const struct { const char *name; void *fn; void *ptsz; } entries[] = {
    { "cuInit", (void *)cuInit, NULL },
    { "cuDriverGetVersion", (void *)cuDriverGetVersion, NULL },
    { "cuLaunchKernel", (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz },
    { "cuLaunchKernelEx", (void *)cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz },
    { "cuGraphLaunch", (void *)cuGraphLaunch, (void *)cuGraphLaunch_ptsz },
};

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status)
{
    (void)version;
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
        if (strcmp(symbol, entries[i].name) == 0) {
            int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && entries[i].ptsz != NULL;
            *pfn = ptsz ? entries[i].ptsz : entries[i].fn;
            if (status != NULL)
                *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    *pfn = NULL;
    if (status != NULL)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

__attribute__((destructor)) static void report(void)
{
    const char *t = getenv("STAND_IN_CUDA_TRACE");
    if (t != NULL && strcmp(t, "1") == 0)
        fprintf(stderr, "[stand_in_cuda] launches: %ld\n", launches);
}
