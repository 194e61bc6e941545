/*
 * cuda_capture: captures work into a CUDA graph and replays it through a libcudart, in the order
 * torch.cuda.graph makes its calls (PyTorch aten/src/ATen/cuda/CUDAGraph.cpp, 2.11: capture_begin ->
 * cudaStreamBeginCapture(capture stream, cudaStreamCaptureModeGlobal); the captured region's kernels on that
 * stream, from the capturing thread and, for a captured backward, from autograd's device thread on the same
 * stream; capture_end -> cudaStreamEndCapture; replay -> cudaGraphLaunch(exec, current stream)). The capture
 * stream comes from cudaStreamCreateWithPriority, as c10's stream pool makes it; a second stream, not captured,
 * from cudaStreamCreateWithFlags. Prototypes as in cuda_runtime_api.h (CUDA 12/13).
 *
 *   cuda_capture LIB   dlopen LIB, print "ready pid=P", wait for a line on stdin, then:
 *     1 launch on the capture stream (before the capture: run)
 *     cudaStreamBeginCapture(capture stream, 0 = cudaStreamCaptureModeGlobal)
 *     3 launches and 1 cudaMemcpyAsync (4096 bytes) on the capture stream        (captured: this thread)
 *     a second thread: 2 launches on the capture stream                           (captured: the stream)
 *                      1 launch on the other stream                               (run)
 *     cudaStreamEndCapture(capture stream, &graph)
 *     2 x cudaGraphLaunch(exec, capture stream)
 *     1 launch on the capture stream and 1 cudaMemcpyAsync (8192 bytes)           (run)
 *   printing "NAME rc=R" for each call.
 * Exit: 0, or 2 on a dlopen/dlsym error.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef struct { unsigned int x, y, z; } dim3;

static cudaError_t (*launch)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
static cudaError_t (*create_prio)(cudaStream_t *, unsigned int, int);
static cudaError_t (*create_flags)(cudaStream_t *, unsigned int);
static cudaError_t (*begin)(cudaStream_t, int);
static cudaError_t (*end)(cudaStream_t, void **);
static cudaError_t (*graph_launch)(void *, cudaStream_t);
static cudaError_t (*memcpy_async)(void *, const void *, size_t, int, cudaStream_t);

static cudaStream_t capture_stream, other_stream;
static char host_a[8192], host_b[8192];
static void kernel(void) {}

static void run_kernel(cudaStream_t s)
{
    dim3 g = {4, 1, 1}, b = {128, 1, 1};
    printf("cudaLaunchKernel rc=%d\n", launch((const void *)kernel, g, b, NULL, 0, s));
}

static void *backward_thread(void *arg)
{
    (void)arg;
    run_kernel(capture_stream);
    run_kernel(capture_stream);
    run_kernel(other_stream);
    return NULL;
}

#define SYM(var, name)                                                   \
    do {                                                                 \
        *(void **)&(var) = dlsym(lib, name);                             \
        if ((var) == NULL) {                                             \
            fprintf(stderr, "%s: %s\n", argv[1], dlerror());            \
            return 2;                                                    \
        }                                                                \
    } while (0)

int main(int argc, char **argv)
{
    char line[16];
    void *graph = NULL;
    pthread_t t;
    if (argc != 2) {
        fprintf(stderr, "usage: %s LIBCUDART\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "%s: %s\n", argv[1], dlerror());
        return 2;
    }
    SYM(launch, "cudaLaunchKernel");
    SYM(create_prio, "cudaStreamCreateWithPriority");
    SYM(create_flags, "cudaStreamCreateWithFlags");
    SYM(begin, "cudaStreamBeginCapture");
    SYM(end, "cudaStreamEndCapture");
    SYM(graph_launch, "cudaGraphLaunch");
    SYM(memcpy_async, "cudaMemcpyAsync");
    printf("ready pid=%d\n", (int)getpid());
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 0;
    create_prio(&capture_stream, 1 /* cudaStreamNonBlocking */, 0);
    create_flags(&other_stream, 1);
    run_kernel(capture_stream);
    printf("cudaStreamBeginCapture rc=%d\n", begin(capture_stream, 0));
    for (int i = 0; i < 3; i++)
        run_kernel(capture_stream);
    printf("cudaMemcpyAsync rc=%d\n", memcpy_async(host_b, host_a, 4096, 1, capture_stream));
    if (pthread_create(&t, NULL, backward_thread, NULL) != 0 || pthread_join(t, NULL) != 0)
        return 2;
    printf("cudaStreamEndCapture rc=%d\n", end(capture_stream, &graph));
    for (int i = 0; i < 2; i++)
        printf("cudaGraphLaunch rc=%d\n", graph_launch((void *)(uintptr_t)0x6b00, capture_stream));
    run_kernel(capture_stream);
    printf("cudaMemcpyAsync rc=%d\n", memcpy_async(host_b, host_a, 8192, 1, capture_stream));
    return 0;
}
