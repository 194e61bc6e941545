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
 *   - cuModuleLoadData / cuModuleGetFunction, as Triton's launcher calls them (see there).
 *   - Memory, with the checks the CUDA 12.9 driver API reference documents for each entry (cuda.h comments):
 *     cuMemAlloc_v2 / cuMemAllocAsync / cuMemAllocManaged give a new device pointer (STAND_IN_CUDA_PTR_BASE +
 *     n * STAND_IN_CUDA_PTR_STEP for the n-th, 0-based) and return CUDA_ERROR_INVALID_VALUE for a 0 size;
 *     cuMemFree_v2 / cuMemFreeAsync free one (0 or an unknown pointer: CUDA_ERROR_INVALID_VALUE).
 *     Virtual memory management as PyTorch's expandable segments use it (c10/cuda/CUDACachingAllocator.cpp,
 *     ExpandableSegment::map/unmapHandles): cuMemGetAllocationGranularity (2 MiB), cuMemAddressReserve /
 *     cuMemAddressFree, cuMemCreate (size a multiple of the granularity, type PINNED, location a device
 *     0..STAND_IN_CUDA_DEVICES-1, else CUDA_ERROR_INVALID_VALUE / CUDA_ERROR_INVALID_DEVICE; handles are
 *     STAND_IN_CUDA_HANDLE_BASE + n), cuMemRelease (an unknown handle: CUDA_ERROR_INVALID_VALUE), cuMemMap /
 *     cuMemUnmap / cuMemSetAccess (argument checks only).  No entry calls another exported one.
 *   - Copies (CUDA 12.9 cuda.h): cuMemcpy / cuMemcpyAsync and the typed cuMemcpy{HtoD,DtoH,DtoD}_v2 and their
 *     Async_v2 forms take (dst, src, ByteCount[, hStream]) and return CUDA_ERROR_INVALID_VALUE for a NULL/0
 *     pointer; nothing is copied (there is no memory).  cuGetProcAddress_v2 hands out cuMemcpy and cuMemcpyAsync
 *     (libcudart 12's strings name both).
 * Launch counts are printed at exit to stderr when STAND_IN_CUDA_TRACE=1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
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

/* ---- memory ---- */
#define STAND_IN_CUDA_PTR_BASE 0x7f6b00000000ULL
#define STAND_IN_CUDA_PTR_STEP 0x200000ULL
#define STAND_IN_CUDA_HANDLE_BASE 0x4a0000ULL
#define STAND_IN_CUDA_DEVICES 2
#define STAND_IN_CUDA_GRANULARITY (2ULL << 20)
#define STAND_IN_CUDA_MAX_LIVE 64

static CUdeviceptr live_ptrs[STAND_IN_CUDA_MAX_LIVE];
static CUmemGenericAllocationHandle live_handles[STAND_IN_CUDA_MAX_LIVE];
static unsigned long long next_ptr, next_handle;

static int remember(unsigned long long *table, unsigned long long v)
{
    for (int i = 0; i < STAND_IN_CUDA_MAX_LIVE; i++)
        if (table[i] == 0) {
            table[i] = v;
            return 1;
        }
    return 0;
}

static int forget(unsigned long long *table, unsigned long long v)
{
    for (int i = 0; v != 0 && i < STAND_IN_CUDA_MAX_LIVE; i++)
        if (table[i] == v) {
            table[i] = 0;
            return 1;
        }
    return 0;
}

static CUresult give_ptr(CUdeviceptr *dptr, size_t bytesize)
{
    if (dptr == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr p = STAND_IN_CUDA_PTR_BASE + next_ptr * STAND_IN_CUDA_PTR_STEP;
    if (!remember(live_ptrs, p))
        return CUDA_ERROR_OUT_OF_MEMORY;
    next_ptr++;
    *dptr = p;
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) { return give_ptr(dptr, bytesize); }
API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s) { (void)s; return give_ptr(dptr, bytesize); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    (void)s;
    return give_ptr(dptr, bytesize);
}
API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return give_ptr(dptr, bytesize);
}
API CUresult cuMemFree_v2(CUdeviceptr p) { return forget(live_ptrs, p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    (void)s;
    return forget(live_ptrs, p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    (void)s;
    return forget(live_ptrs, p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static int device_location(const CUmemAllocationProp *prop)
{
    return prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
           prop->location.id < STAND_IN_CUDA_DEVICES;
}

API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                           CUmemAllocationGranularity_flags option)
{
    (void)option;
    if (granularity == NULL || prop == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!device_location(prop))
        return CUDA_ERROR_INVALID_DEVICE;
    *granularity = STAND_IN_CUDA_GRANULARITY;
    return CUDA_SUCCESS;
}
API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                 unsigned long long flags)
{
    (void)alignment; (void)addr; (void)flags;
    if (ptr == NULL || size == 0 || size % STAND_IN_CUDA_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *ptr = STAND_IN_CUDA_PTR_BASE + (0x1000ULL + next_ptr++) * STAND_IN_CUDA_PTR_STEP;
    return CUDA_SUCCESS;
}
API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) { return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags)
{
    if (handle == NULL || prop == NULL || flags != 0 || size == 0 || size % STAND_IN_CUDA_GRANULARITY != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (!device_location(prop))
        return CUDA_ERROR_INVALID_DEVICE;
    CUmemGenericAllocationHandle h = STAND_IN_CUDA_HANDLE_BASE + next_handle;
    if (!remember(live_handles, h))
        return CUDA_ERROR_OUT_OF_MEMORY;
    next_handle++;
    *handle = h;
    return CUDA_SUCCESS;
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    return forget(live_handles, h) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                      unsigned long long flags)
{
    if (ptr == 0 || size == 0 || offset != 0 || flags != 0 || h == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) { return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    return ptr && size && desc && count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult copy(unsigned long long dst, unsigned long long src)
{
    return dst && src ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { (void)n; return copy(dst, src); }
API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    (void)n; (void)s;
    return copy(dst, src);
}
API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { (void)n; return copy(dst, (uintptr_t)src); }
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { (void)n; return copy((uintptr_t)dst, src); }
API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) { (void)n; return copy(dst, src); }
API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    (void)n; (void)s;
    return copy(dst, (uintptr_t)src);
}
API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    (void)n; (void)s;
    return copy((uintptr_t)dst, src);
}
API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    (void)n; (void)s;
    return copy(dst, src);
}

static const struct { const char *name; void *fn; void *ptsz; } entries[] = {
    { "cuInit", (void *)cuInit, NULL },
    { "cuDriverGetVersion", (void *)cuDriverGetVersion, NULL },
    { "cuLaunchKernel", (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz },
    { "cuLaunchKernelEx", (void *)cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz },
    { "cuGraphLaunch", (void *)cuGraphLaunch, (void *)cuGraphLaunch_ptsz },
    /* cuda.h #defines cuMemAlloc to cuMemAlloc_v2; cuGetProcAddress takes the base name */
    { "cuMemAlloc", (void *)cuMemAlloc_v2, NULL },
    { "cuMemFree", (void *)cuMemFree_v2, NULL },
    { "cuMemAllocAsync", (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz },
    { "cuMemFreeAsync", (void *)cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz },
    { "cuMemAllocManaged", (void *)cuMemAllocManaged, NULL },
    { "cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity, NULL },
    { "cuMemAddressReserve", (void *)cuMemAddressReserve, NULL },
    { "cuMemAddressFree", (void *)cuMemAddressFree, NULL },
    { "cuMemCreate", (void *)cuMemCreate, NULL },
    { "cuMemRelease", (void *)cuMemRelease, NULL },
    { "cuMemMap", (void *)cuMemMap, NULL },
    { "cuMemUnmap", (void *)cuMemUnmap, NULL },
    { "cuMemSetAccess", (void *)cuMemSetAccess, NULL },
    { "cuMemcpy", (void *)cuMemcpy, NULL },
    { "cuMemcpyAsync", (void *)cuMemcpyAsync, NULL },
    { "cuModuleLoadData", (void *)cuModuleLoadData, NULL },
    { "cuModuleGetFunction", (void *)cuModuleGetFunction, NULL },
};

/* Modules as Triton's launcher loads them (triton/backends/nvidia/driver.c loadBinary: cuModuleLoadData, then
 * cuModuleGetFunction for the kernel's name). cuda.h 12.9: a NULL out-pointer or image, or a NULL name, is
 * CUDA_ERROR_INVALID_VALUE; an unknown module CUDA_ERROR_INVALID_HANDLE. No cubin is parsed, so every name is
 * found (the real driver answers CUDA_ERROR_NOT_FOUND for a name the module lacks); the CUfunction is an object of
 * the stand-in's (the real one is opaque too), one per call. */
#define STAND_IN_CUDA_MODULES 16
#define STAND_IN_CUDA_FUNCTIONS 64
static char modules[STAND_IN_CUDA_MODULES];
static int n_modules;
static struct { char name[256]; } functions[STAND_IN_CUDA_FUNCTIONS];
static int n_functions;

API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    if (module == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (n_modules == STAND_IN_CUDA_MODULES)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *module = (CUmodule)(void *)&modules[n_modules++];
    return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    if (hfunc == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if ((char *)(void *)hmod < modules || (char *)(void *)hmod >= modules + n_modules)
        return CUDA_ERROR_INVALID_HANDLE;
    if (n_functions == STAND_IN_CUDA_FUNCTIONS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    snprintf(functions[n_functions].name, sizeof(functions[n_functions].name), "%s", name);
    *hfunc = (CUfunction)(void *)&functions[n_functions++];
    return CUDA_SUCCESS;
}

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
