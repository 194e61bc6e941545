/*
 * Stand-in libcudart.so.13 for the twin, part 6: kernel launches (counted, never run; on a capturing stream,
 * recorded as kernel nodes: cudart_capture.c), the module registration nvcc's generated code makes, driver
 * entry points (none).  Not NVIDIA's library.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cudart_twin.h"

/* ---- kernels: launch configuration kept as nvcc's generated stubs expect; launches are counted ---- */
struct launch_cfg { dim3 g, b; size_t shm; void *st; };
static __thread struct launch_cfg cfg_stack[16];
static __thread int cfg_top;
static long n_launch;
long twin_counts[TWIN_COUNTERS];

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
/* noinline: inlined, its `lock add` became the first instruction of cudaLaunchKernelExC, which a uprobe cannot
 * take (x86 uprobes refuse LOCK-prefixed instructions: "Failed to attach BPF to uprobe"); the real entries start
 * with `push %rbp` */
/* OTEL_EBPF_TWIN_KERNEL_US (read at the first launch; 0 when unset or not a number): each launch outside a capture
 * then occupies its stream that long (an OP_KERNEL op its worker sleeps through), so the stream's later work, NCCL's
 * included, runs that much later, as on a GPU that is slower than its peers. Not a CUDA variable: the twin's own. */
static unsigned kernel_us(void)
{
    static int us = -1;
    int v = __atomic_load_n(&us, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("OTEL_EBPF_TWIN_KERNEL_US");
        long n = e != NULL ? strtol(e, NULL, 10) : 0;
        v = n > 0 && n < 10000000 ? (int)n : 0;
        __atomic_store_n(&us, v, __ATOMIC_RELAXED);
    }
    return (unsigned)v;
}
__attribute__((noinline)) static cudaError_t count_launch(cudaStream_t st)
{
    __atomic_add_fetch(&n_launch, 1, __ATOMIC_RELAXED);
    cudaError_t rc = capture_launch(st); /* every launch counts; one on a capturing stream is also a node of its graph */
    unsigned us = kernel_us();
    if (rc == cudaSuccess && us > 0 && __atomic_load_n(&twin_active_captures, __ATOMIC_ACQUIRE) == 0) {
        struct op *o = new_op(OP_KERNEL);
        if (o == NULL)
            return fail(cudaErrorMemoryAllocation);
        o->u.kernel.us = us;
        rc = submit(st, o, 0, 0);
    }
    return rc;
}
/* __cudaGetKernel(&handle, hostFun) (CUDA 13.0; CUPTI names it __cudaGetKernel_v13000): the cudaKernel_t of a host
 * function, an opaque runtime object (cuda_runtime_api.h: `struct CUkern_st *`), not the host function itself, so a
 * launch's `func` names no code address; the same handle for the same function. nvcc 13's <<<>>> stub keeps it in a
 * static and calls this once per kernel (objdump of torch 2.11's libtorch_cuda.so: a __cxa_guard around the
 * call), then passes it to __cudaLaunchKernel on every launch. */
struct twin_kernel {
    const void *host_fun;
};
#define TWIN_MAX_KERNELS 65536
static struct twin_kernel kernels[TWIN_MAX_KERNELS];
static int n_kernels;
static pthread_mutex_t kernels_mu = PTHREAD_MUTEX_INITIALIZER;

API cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *fun)
{
    if (k == NULL || fun == NULL)
        return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&kernels_mu);
    int i = 0;
    while (i < n_kernels && kernels[i].host_fun != fun)
        i++;
    if (i == n_kernels) {
        if (n_kernels == TWIN_MAX_KERNELS) {
            pthread_mutex_unlock(&kernels_mu);
            return fail(cudaErrorMemoryAllocation);
        }
        kernels[n_kernels++].host_fun = fun;
    }
    *k = (cudaKernel_t)(void *)&kernels[i];
    pthread_mutex_unlock(&kernels_mu);
    return cudaSuccess;
}
/* noinline: a real call into the exported entry, so a uprobe on cudaLaunchKernel sees every launch */
API __attribute__((noinline)) cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **args, size_t shm,
                                                           cudaStream_t st)
{
    (void)f; (void)g; (void)b; (void)args; (void)shm;
    return count_launch(st);
}
/* nvcc 13's <<<>>> stubs call this with the cudaKernel_t of __cudaGetKernel (torch 2.11's libtorch_cuda imports
 * it, not cudaLaunchKernel).  In CUDA 13.0's libcudart.so.13 it is `push %rbp; mov %rsp,%rbp; pop %rbp; jmp
 * cudaLaunchKernel` (objdump of the 13.0 library), so a probe on cudaLaunchKernel counts these launches too,
 * with the handle as its `func`; here likewise. */
API cudaError_t __cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t st)
{
    return cudaLaunchKernel((const void *)k, g, b, args, shm, st);
}
API cudaError_t cudaLaunchCooperativeKernel(const void *f, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t st)
{
    (void)f; (void)g; (void)b; (void)args; (void)shm;
    return count_launch(st); /* its own entry in the real library, not cudaLaunchKernel's */
}
API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *f, void **args)
{
    (void)f; (void)args;
    return count_launch(c != NULL ? c->stream : NULL);
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
    if (twin_tracing())
        fprintf(stderr, "[twin cudart %d] cudaGetDriverEntryPointByVersion(%s, %u): not found\n", (int)getpid(), sym, ver);
    *fp = NULL;
    if (st != NULL)
        *st = cudaDriverEntryPointSymbolNotFound;
    return fail(cudaErrorSymbolNotFound);
}

API cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
API cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

/* At exit: the launch count on stderr (OTEL_EBPF_TWIN_TRACE=1), and in $OTEL_EBPF_TWIN_STATS/cudart-<pid>.txt as
 * "kernel_launches N", "memsets N", "event_records N", "stream_waits N", "captured_launches N", "graph_launches N",
 * "graph_kernels N", "copies N" (cudaMemcpy and cudaMemcpyAsync calls) lines when that directory is given
 * (tests compare it with what a tracer counted, and with
 * what a program captured and replayed). */
__attribute__((destructor)) static void report_launches(void)
{
    const char *dir = getenv("OTEL_EBPF_TWIN_STATS");
    if (twin_tracing())
        fprintf(stderr, "[twin cudart %d] kernel launches: %ld\n", (int)getpid(), n_launch);
    if (dir != NULL && *dir != '\0') {
        char path[512];
        FILE *f;
        snprintf(path, sizeof(path), "%s/cudart-%d.txt", dir, (int)getpid());
        if ((f = fopen(path, "w")) != NULL) {
            fprintf(f, "kernel_launches %ld\nmemsets %ld\nevent_records %ld\nstream_waits %ld\n", n_launch,
                    twin_counts[TWIN_MEMSETS], twin_counts[TWIN_EVENT_RECORDS], twin_counts[TWIN_STREAM_WAITS]);
            fprintf(f, "captured_launches %ld\ngraph_launches %ld\ngraph_kernels %ld\ncopies %ld\n",
                    twin_counts[TWIN_CAPTURED_LAUNCHES], twin_counts[TWIN_GRAPH_LAUNCHES],
                    twin_counts[TWIN_GRAPH_KERNELS], twin_counts[TWIN_COPIES]);
            fclose(f);
        }
    }
}
