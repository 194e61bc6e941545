/*
 * cuda_driver: calls a CUDA 12 runtime (libcudart.so.12) through dlopen/dlsym
 * with a fixed script of KNOWN argument values, so probe tests can assert on
 * what the uprobes decode.  It needs no CUDA headers and no GPU: without a
 * driver the real libcudart returns 35 (cudaErrorInsufficientDriver) from
 * every call, and the uprobes on it still fire.
 *
 * Usage:
 *   cuda_driver LIB [--loops N] [--launch-only] [--delay-before-dlopen-ms M]
 *                   [--sleep-in-call-ms M] [--wait-stdin] [--exit-mid-call]
 *
 *   (default)        run the script below N times (--loops, default 1).
 *   --launch-only    run N cudaLaunchKernel calls in a tight loop (benchmarks);
 *                    prints the last rc and the mean wall time per call.
 *   --delay-before-dlopen-ms M
 *                    sleep M ms before dlopen, so a test can watch a library
 *                    appear in a process that is already running.
 *   --sleep-in-call-ms M
 *                    make every scripted call spend at least M ms INSIDE the
 *                    library function (between uprobe and uretprobe); see
 *                    "In-call sleep" below.
 *   --wait-stdin     after dlopen+dlsym, print "ready pid=P" and block until
 *                    one line arrives on stdin (attach probes, then release).
 *   --exit-mid-call  after the script, a worker thread enters cudaDeviceSynchronize and stays
 *                    inside it (in-call sleep of 10 s); the main thread waits
 *                    200 ms, prints "exit_mid_call in_call=1|0" and calls
 *                    _exit(3).  Probes see an entry with no matching return.
 *
 * Output (stdout, line buffered): one line per event, "NAME key=value ...".
 *   kernel func=0x...           address passed as `func` to both launches
 *   buffers src=0x... dst=0x... host buffers passed to both memcpys
 *   ready pid=P                 only with --wait-stdin
 *   <cudaFunction> rc=N         one per runtime call, in call order
 *   launch_only loops=N ns_per_call=X   only with --launch-only
 * Exit status: 0 when the script ran (whatever the rcs), 1 on usage or
 * dlopen/dlsym errors, 3 from --exit-mid-call.
 *
 * The script (values asserted by tests):
 *   cudaSetDevice(1)
 *   cudaMalloc(&p, 1048576)
 *   cudaMallocManaged(&p2, 4096, 1 = cudaMemAttachGlobal)
 *   cudaMallocAsync(&p3, 8192, NULL)
 *   cudaMemcpy(dst, src, 65536, 1 = cudaMemcpyHostToDevice)
 *   cudaMemcpyAsync(dst, src, 32768, 2 = cudaMemcpyDeviceToHost, NULL)
 *   cudaLaunchKernel(func, {7,3,2}, {128,2,1}, args, 256, NULL)
 *   cudaLaunchKernelExC(&{grid {5,1,1}, block {64,1,1}, smem 512, NULL,
 *                         attrs NULL, numAttrs 0}, func, args)
 *   cudaStreamSynchronize(NULL)
 *   cudaDeviceSynchronize()
 *   cudaEventSynchronize(NULL)
 *   cudaFree(p)
 *   cudaFreeAsync(p3, NULL)
 *
 * ABI of cudaLaunchKernel on x86-64 (SysV).  dim3 is a 12-byte struct of
 * three unsigned ints passed by value: two INTEGER eightbytes each.  Checked
 * with gcc 12.2 -O1 on this file (objdump -d of the script's call):
 *     push   $0x0                 ; stream = NULL  (pushed first)
 *     push   $0x100               ; sharedMem = 256 (pushed last)
 *     lea    kernel_args,%r9      ; args
 *     mov    -0x80(%rbp),%rcx     ; blockDim.x | blockDim.y << 32 (8 bytes)
 *     mov    -0x78(%rbp),%r8d     ; blockDim.z
 *     mov    -0x8c(%rbp),%rsi     ; gridDim.x | gridDim.y << 32 (8 bytes)
 *     mov    -0x84(%rbp),%edx     ; gridDim.z
 *     mov    %r13,%rdi            ; func = fake_kernel_saxpy
 *     call   *rt+0x30             ; cudaLaunchKernel
 * and a standalone caller with constants compiled (gcc -S) to
 *     pushq $21845 ; pushq $256 ; movq -24(%rbp),%rcx ; movl $1,%r8d ;
 *     movq -12(%rbp),%rsi ; movl $2,%edx ; movl $43968,%edi ; call
 * So at function entry: rdi=func, rsi=grid.x|grid.y<<32, rdx=grid.z,
 * rcx=block.x|block.y<<32, r8=block.z, r9=args, 8(%rsp)=sharedMem,
 * 16(%rsp)=stream (0(%rsp) is the return address).  The high 32 bits of
 * rdx and r8 are padding of the second eightbyte: the ABI leaves them
 * undefined (here `mov ...,%edx` happens to zero them), so a decoder must
 * mask z with 0xffffffff.
 * cudaLaunchKernelExC takes the config by pointer: rdi=&config, rsi=func,
 * rdx=args; config layout: grid@0, block@12, dynamicSmemBytes@24,
 * stream@32, attrs@40, numAttrs@48, sizeof 56 (asserted below).
 *
 * In-call sleep: the real libcudart cannot be told to take longer, so this
 * program exports its own pthread_once (linked with -rdynamic, which puts it
 * ahead of libc's in symbol lookup).  libcudart 12.9.79 calls pthread_once
 * twice on every API entry (counted on this machine); when the calling
 * thread has a sleep pending, the first such call sleeps.  The sleep thus
 * runs inside the cudaX frame.  If a library never calls pthread_once the
 * sleep is not applied and a warning goes to stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* CUDA 12 runtime types, declared here so no CUDA headers are needed. */
typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef struct { unsigned int x, y, z; } dim3;
typedef struct {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    void *attrs;              /* cudaLaunchAttribute* */
    unsigned int numAttrs;
} cudaLaunchConfig_t;

_Static_assert(sizeof(dim3) == 12, "dim3 is 12 bytes");
_Static_assert(offsetof(cudaLaunchConfig_t, blockDim) == 12, "blockDim@12");
_Static_assert(offsetof(cudaLaunchConfig_t, dynamicSmemBytes) == 24, "smem@24");
_Static_assert(offsetof(cudaLaunchConfig_t, stream) == 32, "stream@32");
_Static_assert(offsetof(cudaLaunchConfig_t, attrs) == 40, "attrs@40");
_Static_assert(offsetof(cudaLaunchConfig_t, numAttrs) == 48, "numAttrs@48");
_Static_assert(sizeof(cudaLaunchConfig_t) == 56, "cudaLaunchConfig_t is 56 bytes");

enum { cudaMemAttachGlobal = 1, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };

static struct {
    cudaError_t (*SetDevice)(int);
    cudaError_t (*Malloc)(void **, size_t);
    cudaError_t (*MallocManaged)(void **, size_t, unsigned int);
    cudaError_t (*MallocAsync)(void **, size_t, cudaStream_t);
    cudaError_t (*Memcpy)(void *, const void *, size_t, int);
    cudaError_t (*MemcpyAsync)(void *, const void *, size_t, int, cudaStream_t);
    cudaError_t (*LaunchKernel)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
    cudaError_t (*LaunchKernelExC)(const cudaLaunchConfig_t *, const void *, void **);
    cudaError_t (*StreamSynchronize)(cudaStream_t);
    cudaError_t (*DeviceSynchronize)(void);
    cudaError_t (*EventSynchronize)(cudaEvent_t);
    cudaError_t (*Free)(void *);
    cudaError_t (*FreeAsync)(void *, cudaStream_t);
} rt;

/* ---- in-call sleep (see header) ---- */

static int (*real_pthread_once)(pthread_once_t *, void (*)(void));
static __thread long pending_sleep_ms;   /* >0: next pthread_once sleeps */
static atomic_int worker_in_call;

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

__attribute__((constructor)) static void resolve_pthread_once(void)
{
    real_pthread_once = (int (*)(pthread_once_t *, void (*)(void)))dlsym(RTLD_NEXT, "pthread_once");
}

int pthread_once(pthread_once_t *once, void (*init)(void))
{
    long ms = pending_sleep_ms;
    if (real_pthread_once == NULL)   /* called before the constructor ran */
        resolve_pthread_once();
    if (ms > 0) {
        pending_sleep_ms = 0;
        atomic_store(&worker_in_call, 1);
        sleep_ms(ms);
    }
    return real_pthread_once(once, init);
}

/* ---- the script ---- */

static long sleep_in_call_ms;

static void report(const char *name, cudaError_t rc)
{
    if (pending_sleep_ms > 0) {
        fprintf(stderr, "warning: in-call sleep not applied to %s\n", name);
        pending_sleep_ms = 0;
    }
    printf("%s rc=%d\n", name, rc);
}

/* Arms the in-call sleep for the next runtime call, then makes it. */
#define CALL(name, expr) do { pending_sleep_ms = sleep_in_call_ms; report(name, (expr)); } while (0)

/* Never run on a device: only its address is passed as the kernel. */
__attribute__((noinline)) void fake_kernel_saxpy(float a, const float *x, float *y, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

static float kernel_a = 2.0f;
static int kernel_n = 16;
static float *kernel_x, *kernel_y;
static void *kernel_args[] = { &kernel_a, &kernel_x, &kernel_y, &kernel_n };

static void run_script(unsigned char *src, unsigned char *dst)
{
    void *p = NULL, *p2 = NULL, *p3 = NULL;
    dim3 grid = { 7, 3, 2 }, block = { 128, 2, 1 };
    cudaLaunchConfig_t cfg;

    memset(&cfg, 0, sizeof(cfg));
    cfg.gridDim = (dim3){ 5, 1, 1 };
    cfg.blockDim = (dim3){ 64, 1, 1 };
    cfg.dynamicSmemBytes = 512;
    cfg.stream = NULL;
    cfg.attrs = NULL;
    cfg.numAttrs = 0;

    CALL("cudaSetDevice", rt.SetDevice(1));
    CALL("cudaMalloc", rt.Malloc(&p, 1048576));
    CALL("cudaMallocManaged", rt.MallocManaged(&p2, 4096, cudaMemAttachGlobal));
    CALL("cudaMallocAsync", rt.MallocAsync(&p3, 8192, NULL));
    CALL("cudaMemcpy", rt.Memcpy(dst, src, 65536, cudaMemcpyHostToDevice));
    CALL("cudaMemcpyAsync", rt.MemcpyAsync(dst, src, 32768, cudaMemcpyDeviceToHost, NULL));
    CALL("cudaLaunchKernel",
         rt.LaunchKernel((const void *)fake_kernel_saxpy, grid, block, kernel_args, 256, NULL));
    CALL("cudaLaunchKernelExC", rt.LaunchKernelExC(&cfg, (const void *)fake_kernel_saxpy, kernel_args));
    CALL("cudaStreamSynchronize", rt.StreamSynchronize(NULL));
    CALL("cudaDeviceSynchronize", rt.DeviceSynchronize());
    CALL("cudaEventSynchronize", rt.EventSynchronize(NULL));
    CALL("cudaFree", rt.Free(p));
    CALL("cudaFreeAsync", rt.FreeAsync(p3, NULL));
}

static void run_launch_only(long loops)
{
    dim3 grid = { 7, 3, 2 }, block = { 128, 2, 1 };
    struct timespec t0, t1;
    cudaError_t rc = 0;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < loops; i++)
        rc = rt.LaunchKernel((const void *)fake_kernel_saxpy, grid, block, kernel_args, 256, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long ns = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    printf("cudaLaunchKernel rc=%d\n", rc);
    printf("launch_only loops=%ld ns_per_call=%lld\n", loops, loops > 0 ? ns / loops : 0);
}

static void *exit_worker(void *arg)
{
    (void)arg;
    for (;;) {
        pending_sleep_ms = 10000;
        rt.DeviceSynchronize();
    }
    return NULL;
}

static void run_exit_mid_call(void)
{
    pthread_t th;
    if (pthread_create(&th, NULL, exit_worker, NULL) != 0) {
        perror("pthread_create");
        exit(1);
    }
    sleep_ms(200);
    printf("exit_mid_call in_call=%d\n", atomic_load(&worker_in_call));
    fflush(stdout);
    _exit(3);
}

/* ---- setup ---- */

static void *must_sym(void *lib, const char *name)
{
    void *sym = dlsym(lib, name);
    if (sym == NULL) {
        fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return sym;
}

static void load(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
        exit(1);
    }
    *(void **)&rt.SetDevice = must_sym(lib, "cudaSetDevice");
    *(void **)&rt.Malloc = must_sym(lib, "cudaMalloc");
    *(void **)&rt.MallocManaged = must_sym(lib, "cudaMallocManaged");
    *(void **)&rt.MallocAsync = must_sym(lib, "cudaMallocAsync");
    *(void **)&rt.Memcpy = must_sym(lib, "cudaMemcpy");
    *(void **)&rt.MemcpyAsync = must_sym(lib, "cudaMemcpyAsync");
    *(void **)&rt.LaunchKernel = must_sym(lib, "cudaLaunchKernel");
    *(void **)&rt.LaunchKernelExC = must_sym(lib, "cudaLaunchKernelExC");
    *(void **)&rt.StreamSynchronize = must_sym(lib, "cudaStreamSynchronize");
    *(void **)&rt.DeviceSynchronize = must_sym(lib, "cudaDeviceSynchronize");
    *(void **)&rt.EventSynchronize = must_sym(lib, "cudaEventSynchronize");
    *(void **)&rt.Free = must_sym(lib, "cudaFree");
    *(void **)&rt.FreeAsync = must_sym(lib, "cudaFreeAsync");
}

static long parse_long(const char *flag, const char *value)
{
    char *end;
    long v;
    if (value == NULL) {
        fprintf(stderr, "%s needs a value\n", flag);
        exit(1);
    }
    errno = 0;
    v = strtol(value, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0) {
        fprintf(stderr, "%s: bad value '%s'\n", flag, value);
        exit(1);
    }
    return v;
}

int main(int argc, char **argv)
{
    long loops = 1, delay_ms = 0;
    int launch_only = 0, wait_stdin = 0, exit_mid_call = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s LIBCUDART [--loops N] [--launch-only] [--delay-before-dlopen-ms M]"
                        " [--sleep-in-call-ms M] [--wait-stdin] [--exit-mid-call]\n", argv[0]);
        return 1;
    }
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--loops") == 0)
            loops = parse_long(argv[i], argv[i + 1]), i++;
        else if (strcmp(argv[i], "--delay-before-dlopen-ms") == 0)
            delay_ms = parse_long(argv[i], argv[i + 1]), i++;
        else if (strcmp(argv[i], "--sleep-in-call-ms") == 0)
            sleep_in_call_ms = parse_long(argv[i], argv[i + 1]), i++;
        else if (strcmp(argv[i], "--launch-only") == 0)
            launch_only = 1;
        else if (strcmp(argv[i], "--wait-stdin") == 0)
            wait_stdin = 1;
        else if (strcmp(argv[i], "--exit-mid-call") == 0)
            exit_mid_call = 1;
        else {
            fprintf(stderr, "unknown argument: %s\n", argv[i]);
            return 1;
        }
    }

    if (delay_ms > 0)
        sleep_ms(delay_ms);
    load(argv[1]);
    if (wait_stdin) {
        char line[64];
        printf("ready pid=%d\n", (int)getpid());
        if (fgets(line, sizeof(line), stdin) == NULL)
            return 1;
    }
    if (launch_only) {
        run_launch_only(loops);
        return 0;
    }

    unsigned char *src = malloc(65536), *dst = malloc(65536);
    kernel_x = calloc(16, sizeof(float));
    kernel_y = calloc(16, sizeof(float));
    if (src == NULL || dst == NULL || kernel_x == NULL || kernel_y == NULL)
        return 1;
    for (int i = 0; i < 65536; i++)
        src[i] = (unsigned char)i;
    memset(dst, 0, 65536);
    printf("kernel func=%p\n", (void *)fake_kernel_saxpy);
    printf("buffers src=%p dst=%p\n", (void *)src, (void *)dst);
    for (long i = 0; i < loops; i++)
        run_script(src, dst);
    if (exit_mid_call) /* after the script: completed calls first, then death inside a call */
        run_exit_mid_call();
    return 0;
}
