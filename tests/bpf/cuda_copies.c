/*
 * cuda_copies: copies made through a runtime and straight on the driver, on one thread, for
 * tests/bpf/test_cuda_driver.py.  The runtime (tests/bpf/stand_in_cudart.c) copies through the driver
 * (tests/bpf/stand_in_cuda.c) as libcudart 12 does; the direct calls are made as their real callers make them:
 *   - the typed entry points, as JAX/XLA's stream executor calls them (xla/stream_executor/cuda/cuda_executor.cc
 *     and cuda_stream.cc: cuMemcpyHtoD, cuMemcpyDtoH, cuMemcpyDtoD and their Async forms, which cuda.h #defines to
 *     the _v2 symbols) and Numba binds them (numba/cuda/cudadrv/driver.py: by name, the _v2 form first);
 *   - cuMemcpy / cuMemcpyAsync (unified addressing), as Numba's and CuPy's peer and managed copies do.
 * Prototypes from the cuda.h of the nvidia-cuda-runtime-cu12 wheel (built with -I to it).
 *
 * Usage: cuda_copies LIBCUDART   (libcuda.so.1 found through LD_LIBRARY_PATH, by both)
 * prints "ready pid=P", waits for a line on stdin, then makes these calls, printing "NAME rc=N" after each:
 *   cudaMemcpy(d, host, 1024, HostToDevice)              runtime -> cuMemcpy
 *   cudaMemcpyAsync(host, d, 2048, DeviceToHost, 0x71)   runtime -> cuMemcpyAsync
 *   cuMemcpyHtoD_v2(d, host, 4096)                       direct, and so on, the bytes doubling
 *   cuMemcpyDtoH_v2(host, d, 8192)
 *   cuMemcpyDtoD_v2(d2, d, 16384)
 *   cuMemcpyHtoDAsync_v2(d, host, 32768, 0x72)
 *   cuMemcpyDtoHAsync_v2(host, d, 65536, 0x72)
 *   cuMemcpyDtoDAsync_v2(d2, d, 131072, 0x72)
 *   cuMemcpy(d2, d, 262144)
 *   cuMemcpyAsync(d2, d, 524288, 0x73)
 *   cuMemcpyHtoD_v2(0, host, 1)                          fails: CUDA_ERROR_INVALID_VALUE
 * with "ptr d=0x... d2=0x... host=0x..." before them.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cuda.h>

typedef int (*rt_copy_t)(void *, const void *, size_t, int);
typedef int (*rt_copy_async_t)(void *, const void *, size_t, int, void *);

static void *drv;

static void *sym(void *lib, const char *name)
{
    void *f = dlsym(lib, name);
    if (f == NULL) {
        fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return f;
}

#define CHECK(name, call) printf("%s rc=%d\n", name, (int)(call))

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: cuda_copies LIBCUDART\n");
        return 2;
    }
    void *rt = dlopen(argv[1], RTLD_NOW);
    drv = dlopen("libcuda.so.1", RTLD_NOW);
    if (rt == NULL || drv == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    rt_copy_t rt_copy = (rt_copy_t)sym(rt, "cudaMemcpy");
    rt_copy_async_t rt_copy_async = (rt_copy_async_t)sym(rt, "cudaMemcpyAsync");
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = sym(drv, "cuMemAlloc_v2");
    CUresult (*htod)(CUdeviceptr, const void *, size_t) = sym(drv, "cuMemcpyHtoD_v2");
    CUresult (*dtoh)(void *, CUdeviceptr, size_t) = sym(drv, "cuMemcpyDtoH_v2");
    CUresult (*dtod)(CUdeviceptr, CUdeviceptr, size_t) = sym(drv, "cuMemcpyDtoD_v2");
    CUresult (*htod_async)(CUdeviceptr, const void *, size_t, CUstream) = sym(drv, "cuMemcpyHtoDAsync_v2");
    CUresult (*dtoh_async)(void *, CUdeviceptr, size_t, CUstream) = sym(drv, "cuMemcpyDtoHAsync_v2");
    CUresult (*dtod_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = sym(drv, "cuMemcpyDtoDAsync_v2");
    CUresult (*unified)(CUdeviceptr, CUdeviceptr, size_t) = sym(drv, "cuMemcpy");
    CUresult (*unified_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = sym(drv, "cuMemcpyAsync");

    CUdeviceptr d = 0, d2 = 0;
    if (mem_alloc(&d, 1 << 20) != CUDA_SUCCESS || mem_alloc(&d2, 1 << 20) != CUDA_SUCCESS)
        return 1;
    static char host[1 << 20];
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    char line[16];
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 1;
    printf("ptr d=0x%llx d2=0x%llx host=%p\n", (unsigned long long)d, (unsigned long long)d2, (void *)host);

    CUstream s2 = (CUstream)(uintptr_t)0x72, s3 = (CUstream)(uintptr_t)0x73;
    CHECK("cudaMemcpy", rt_copy((void *)(uintptr_t)d, host, 1024, 1));
    CHECK("cudaMemcpyAsync", rt_copy_async(host, (void *)(uintptr_t)d, 2048, 2, (void *)(uintptr_t)0x71));
    CHECK("cuMemcpyHtoD_v2", htod(d, host, 4096));
    CHECK("cuMemcpyDtoH_v2", dtoh(host, d, 8192));
    CHECK("cuMemcpyDtoD_v2", dtod(d2, d, 16384));
    CHECK("cuMemcpyHtoDAsync_v2", htod_async(d, host, 32768, s2));
    CHECK("cuMemcpyDtoHAsync_v2", dtoh_async(host, d, 65536, s2));
    CHECK("cuMemcpyDtoDAsync_v2", dtod_async(d2, d, 131072, s2));
    CHECK("cuMemcpy", unified(d2, d, 262144));
    CHECK("cuMemcpyAsync", unified_async(d2, d, 524288, s3));
    CHECK("cuMemcpyHtoD_v2", htod(0, host, 1));
    fflush(stdout);
    return 0;
}
