/*
 * cuda_mixed: kernel launches and graph replays made through a runtime and straight on the driver, on one
 * thread, for tests/bpf/test_cuda_driver.py: the runtime (tests/bpf/stand_in_cudart.c) calls into the driver
 * (tests/bpf/stand_in_cuda.c) for each of its launches, as libcudart does; the direct calls are made as
 * Triton's launcher makes them (dlopen("libcuda.so.1"), dlsym("cuLaunchKernelEx"): triton/backends/nvidia/
 * driver.c) and as cuBLAS's static runtime or NCCL reach the driver.  Prototypes as in cuda.h (CUDA 12).
 *
 * Usage: cuda_mixed LIBCUDART   (libcuda.so.1 found through LD_LIBRARY_PATH, by both)
 * prints "ready pid=P", waits for a line on stdin, then runs, printing "NAME rc=N" after each:
 *   cuModuleLoadData(&mod, image); cuModuleGetFunction(&fn, mod, "triton_poi_fused_add_0")   as Triton loads
 *   2 x cudaLaunchKernel(func, {2,1,1}, {32,1,1}, args, 0, NULL)              runtime -> cuLaunchKernel
 *   3 x cuLaunchKernel(fn, 4,1,1, 64,1,1, 256, (stream)0x61, args, NULL)      direct
 *   1 x cudaLaunchKernelExC({grid {5,1,1}, block {128,1,1}, smem 0}, func)    runtime -> cuLaunchKernelEx
 *   1 x cuLaunchKernelEx({grid {6,1,1}, block {32,2,1}, smem 512, (stream)0x62}, fn)   direct
 *   1 x cuLaunchKernel_ptsz(fn, 7,1,1, 16,1,1, 0, (stream)0x64, args, NULL)    direct
 *   1 x cudaGraphLaunch((exec)0x7000, (stream)0x63)                            runtime -> cuGraphLaunch
 *   1 x cuGraphLaunch((exec)0x7001, (stream)0x63)                              direct
 * and "kernel func=0x... fn=0x..." first: func is the host function `fake_kernel` (what CUDA 12's <<<>>> passes
 * the runtime), fn the driver's CUfunction.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { unsigned int x, y, z; } dim3;
typedef struct { dim3 g, b; size_t smem; void *stream; void *attrs; unsigned int n; } cudaLaunchConfig_t;
typedef struct { dim3 g, b; unsigned int smem; void *stream; void *attrs; unsigned int n; } CUlaunchConfig;

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
    static int n = 3;
    static void *args[] = { &n };
    char line[16];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 2) {
        fprintf(stderr, "usage: %s LIBCUDART\n", argv[0]);
        return 1;
    }
    void *rt = dlopen(argv[1], RTLD_NOW);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    if (rt == NULL || drv == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    int (*launch)(const void *, dim3, dim3, void **, size_t, void *) = sym(rt, "cudaLaunchKernel");
    int (*launch_exc)(const cudaLaunchConfig_t *, const void *, void **) = sym(rt, "cudaLaunchKernelExC");
    int (*graph)(void *, void *) = sym(rt, "cudaGraphLaunch");
    int (*cu_launch)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                     void **, void **) = sym(drv, "cuLaunchKernel");
    int (*cu_launch_ptsz)(const void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          void *, void **, void **) = sym(drv, "cuLaunchKernel_ptsz");
    int (*cu_launch_ex)(const CUlaunchConfig *, const void *, void **, void **) = sym(drv, "cuLaunchKernelEx");
    int (*cu_graph)(void *, void *) = sym(drv, "cuGraphLaunch");
    int (*load)(void **, const void *) = sym(drv, "cuModuleLoadData");
    int (*get_function)(void **, void *, const char *) = sym(drv, "cuModuleGetFunction");
    static const char image[] = "stand-in cubin";
    void *mod = NULL, *fn = NULL;
    printf("ready pid=%d\n", (int)getpid());
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 1;
    printf("cuModuleLoadData rc=%d\n", load(&mod, image));
    printf("cuModuleGetFunction rc=%d\n", get_function(&fn, mod, "triton_poi_fused_add_0"));
    printf("kernel func=%p fn=%p\n", (void *)fake_kernel, fn);
    for (int i = 0; i < 2; i++)
        printf("cudaLaunchKernel rc=%d\n", launch((void *)fake_kernel, (dim3){ 2, 1, 1 }, (dim3){ 32, 1, 1 }, args,
                                                  0, NULL));
    for (int i = 0; i < 3; i++)
        printf("cuLaunchKernel rc=%d\n", cu_launch(fn, 4, 1, 1, 64, 1, 1, 256, (void *)0x61, args,
                                                   NULL));
    cudaLaunchConfig_t rc;
    memset(&rc, 0, sizeof(rc));
    rc.g = (dim3){ 5, 1, 1 };
    rc.b = (dim3){ 128, 1, 1 };
    printf("cudaLaunchKernelExC rc=%d\n", launch_exc(&rc, (void *)fake_kernel, args));
    CUlaunchConfig dc;
    memset(&dc, 0xff, sizeof(dc));  /* padding after smem is garbage, as it may be in a caller's struct */
    dc.g = (dim3){ 6, 1, 1 };
    dc.b = (dim3){ 32, 2, 1 };
    dc.smem = 512;
    dc.stream = (void *)0x62;
    dc.attrs = NULL;
    dc.n = 0;
    printf("cuLaunchKernelEx rc=%d\n", cu_launch_ex(&dc, fn, args, NULL));
    printf("cuLaunchKernel_ptsz rc=%d\n", cu_launch_ptsz(fn, 7, 1, 1, 16, 1, 1, 0, (void *)0x64,
                                                         args, NULL));
    printf("cudaGraphLaunch rc=%d\n", graph((void *)0x7000, (void *)0x63));
    printf("cuGraphLaunch rc=%d\n", cu_graph((void *)0x7001, (void *)0x63));
    return 0;
}
