/*
 * cuda_ptsz: calls the per-thread-default-stream entry points of a libcudart.so.12 once each,
 * with known values, for tests/bpf/test_cuda_receiver.py (tests/support/cuda_driver calls
 * only the legacy-stream ones).  No CUDA headers, no GPU needed (the real library returns 35).
 *
 * Usage: cuda_ptsz LIB      prints "ready pid=P", waits for a line on stdin, then runs:
 *   cudaMallocAsync_ptsz(&p, 12288, (stream)0x51)
 *   cudaMemcpy_ptds(dst, src, 1024, 1 = HostToDevice)
 *   cudaMemcpyAsync_ptsz(dst, src, 2048, 3 = DeviceToDevice, (stream)0x52)
 *   cudaLaunchKernel_ptsz(func, {3,2,1}, {32,4,2}, args, 128, (stream)0x53)
 *   cudaLaunchKernelExC_ptsz(&{grid {9,1,1}, block {16,16,1}, smem 64, (stream)0x54}, func, args)
 *   cudaStreamSynchronize_ptsz((stream)0x55)
 *   cudaFreeAsync_ptsz(p, (stream)0x56)
 * printing "NAME rc=N" after each, and "buffers src=0x.. dst=0x.." and "kernel func=0x.." first.
 * Stream handles are never dereferenced by the runtime without a driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef struct { unsigned int x, y, z; } dim3;
typedef struct {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    void *attrs;
    unsigned int numAttrs;
} cudaLaunchConfig_t;

static void *sym(void *lib, const char *name)
{
    void *f = dlsym(lib, name);
    if (f == NULL) {
        fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return f;
}

__attribute__((noinline)) void fake_kernel(int n) { (void)n; }

int main(int argc, char **argv)
{
    static unsigned char src[4096], dst[4096];
    static int n = 3;
    static void *args[] = { &n };
    char line[16];
    void *p = NULL;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: %s LIBCUDART\n", argv[0]);
        return 1;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "dlopen(%s): %s\n", argv[1], dlerror());
        return 1;
    }
    cudaError_t (*malloc_async)(void **, size_t, cudaStream_t) = sym(lib, "cudaMallocAsync_ptsz");
    cudaError_t (*memcpy_ptds)(void *, const void *, size_t, int) = sym(lib, "cudaMemcpy_ptds");
    cudaError_t (*memcpy_async)(void *, const void *, size_t, int, cudaStream_t) = sym(lib, "cudaMemcpyAsync_ptsz");
    cudaError_t (*launch)(const void *, dim3, dim3, void **, size_t, cudaStream_t) = sym(lib, "cudaLaunchKernel_ptsz");
    cudaError_t (*launch_exc)(const cudaLaunchConfig_t *, const void *, void **) = sym(lib, "cudaLaunchKernelExC_ptsz");
    cudaError_t (*stream_sync)(cudaStream_t) = sym(lib, "cudaStreamSynchronize_ptsz");
    cudaError_t (*free_async)(void *, cudaStream_t) = sym(lib, "cudaFreeAsync_ptsz");

    printf("ready pid=%d\n", (int)getpid());
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 1;
    printf("buffers src=%p dst=%p\n", (void *)src, (void *)dst);
    printf("kernel func=%p\n", (void *)fake_kernel);

    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.gridDim = (dim3){ 9, 1, 1 };
    cfg.blockDim = (dim3){ 16, 16, 1 };
    cfg.dynamicSmemBytes = 64;
    cfg.stream = (cudaStream_t)0x54;

    printf("cudaMallocAsync_ptsz rc=%d\n", malloc_async(&p, 12288, (cudaStream_t)0x51));
    printf("cudaMemcpy_ptds rc=%d\n", memcpy_ptds(dst, src, 1024, 1));
    printf("cudaMemcpyAsync_ptsz rc=%d\n", memcpy_async(dst, src, 2048, 3, (cudaStream_t)0x52));
    printf("cudaLaunchKernel_ptsz rc=%d\n", launch((const void *)fake_kernel, (dim3){ 3, 2, 1 },
                                                   (dim3){ 32, 4, 2 }, args, 128, (cudaStream_t)0x53));
    printf("cudaLaunchKernelExC_ptsz rc=%d\n", launch_exc(&cfg, (const void *)fake_kernel, args));
    printf("cudaStreamSynchronize_ptsz rc=%d\n", stream_sync((cudaStream_t)0x55));
    printf("cudaFreeAsync_ptsz rc=%d\n", free_async(p, (cudaStream_t)0x56));
    return 0;
}
