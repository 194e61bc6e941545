/*
 * cuda_vmm: device memory taken through a runtime and straight from the driver, on one thread, for
 * tests/bpf/test_cuda_driver.py.  The runtime (tests/bpf/stand_in_cudart.c) allocates through the driver
 * (tests/bpf/stand_in_cuda.c) as libcudart 12 does; the direct calls are made as their real callers make them:
 *   - cuMemAlloc_v2 / cuMemFree_v2 as CuPy and Numba allocate (the driver's entry points, by name);
 *   - PyTorch's expandable segments (c10/cuda/CUDACachingAllocator.cpp, ExpandableSegment: a reserved range,
 *     then per segment cuMemCreate(&handle, segment_size, &prop {PINNED, device}, 0), cuMemMap and
 *     cuMemSetAccess; unmapHandles: cuMemUnmap, cuMemRelease), with the entry points resolved through the driver's
 *     cuGetProcAddress as c10/cuda/driver_api.cpp does (through cudaGetDriverEntryPointByVersion).
 * Prototypes from the cuda.h of the nvidia-cuda-runtime-cu12 wheel (built with -I to it).
 *
 * Usage: cuda_vmm LIBCUDART   (libcuda.so.1 found through LD_LIBRARY_PATH, by both)
 * prints "ready pid=P", waits for a line on stdin, then, printing "NAME rc=N" after each call:
 *   cudaMalloc(&p, 1 MiB)                          runtime -> cuMemAlloc_v2
 *   cuMemAlloc_v2(&d, 4096)                        direct
 *   cuMemAddressReserve(&va, 4 x granularity)      (not probed)
 *   cuMemCreate(&h1, granularity, {device 1})      direct, twice (h1, h2), each mapped (not probed)
 *   cuMemCreate(&bad, granularity + 1, {device 1}) fails: CUDA_ERROR_INVALID_VALUE
 *   cuMemUnmap(va + g, g); cuMemRelease(h2)        h1 stays: outstanding on device 1
 *   cuMemFree_v2(d); cudaFree(p)                   direct; runtime -> cuMemFree_v2
 * and "ptr p=0x... d=0x... h1=0x... h2=0x... granularity=N" before the frees.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cuda.h>

typedef int (*rt_malloc_t)(void **, size_t);
typedef int (*rt_free_t)(void *);
typedef CUresult (*proc_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static proc_t get_proc;

static void *entry(const char *name)
{
    void *f = NULL;
    CUdriverProcAddressQueryResult q;
    if (get_proc(name, &f, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS || f == NULL) {
        fprintf(stderr, "cuGetProcAddress(%s) failed\n", name);
        exit(1);
    }
    return f;
}

#define CHECK(name, call)                                                \
    do {                                                                 \
        int rc_ = (int)(call);                                           \
        printf("%s rc=%d\n", name, rc_);                                 \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: cuda_vmm LIBCUDART\n");
        return 2;
    }
    void *rt = dlopen(argv[1], RTLD_NOW);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    if (rt == NULL || drv == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    rt_malloc_t rt_malloc = (rt_malloc_t)dlsym(rt, "cudaMalloc");
    rt_free_t rt_free = (rt_free_t)dlsym(rt, "cudaFree");
    get_proc = (proc_t)dlsym(drv, "cuGetProcAddress_v2");
    if (rt_malloc == NULL || rt_free == NULL || get_proc == NULL) {
        fprintf(stderr, "dlsym: %s\n", dlerror());
        return 1;
    }
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = entry("cuMemAlloc");
    CUresult (*mem_free)(CUdeviceptr) = entry("cuMemFree");
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags) =
        entry("cuMemGetAllocationGranularity");
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) = entry("cuMemAddressReserve");
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long) =
        entry("cuMemCreate");
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = entry("cuMemMap");
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t) = entry("cuMemSetAccess");
    CUresult (*unmap)(CUdeviceptr, size_t) = entry("cuMemUnmap");
    CUresult (*release)(CUmemGenericAllocationHandle) = entry("cuMemRelease");

    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    char line[16];
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 1;

    void *p = NULL;
    CUdeviceptr d = 0, va = 0;
    CHECK("cudaMalloc", rt_malloc(&p, 1 << 20));
    CHECK("cuMemAlloc_v2", mem_alloc(&d, 4096));

    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    size_t g = 0;
    if (granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || reserve(&va, 4 * g, 0, 0, 0) != 0)
        return 1;
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 1}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CUmemGenericAllocationHandle h1 = 0, h2 = 0, bad = 0;
    CHECK("cuMemCreate", create(&h1, g, &prop, 0));
    if (map(va, g, 0, h1, 0) != 0 || set_access(va, g, &access, 1) != 0)
        return 1;
    CHECK("cuMemCreate", create(&h2, g, &prop, 0));
    if (map(va + g, g, 0, h2, 0) != 0 || set_access(va + g, g, &access, 1) != 0)
        return 1;
    CHECK("cuMemCreate", create(&bad, g + 1, &prop, 0));
    printf("ptr p=%p d=0x%llx h1=0x%llx h2=0x%llx granularity=0x%zx\n", p, d, h1, h2, g);
    if (unmap(va + g, g) != 0)
        return 1;
    CHECK("cuMemRelease", release(h2));
    CHECK("cuMemFree_v2", mem_free(d));
    CHECK("cudaFree", rt_free(p));
    fflush(stdout);
    return 0;
}
