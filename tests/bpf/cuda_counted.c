/*
 * cuda_counted: calls the counted-only entry points of a libcudart.so.12 (receivers/cuda: count_return) with
 * known sizes, for tests/bpf/test_cuda_receiver.py.  No CUDA headers, no GPU needed.
 *
 * Usage: cuda_counted LIB   prints "ready pid=P", waits for a line on stdin, then runs:
 *   cudaStreamCreateWithPriority(&s, 1, -1); cudaEventCreateWithFlags(&e, 2)
 *   3 x cudaMemsetAsync(buf, 0, 4096, s)     (12288 bytes)
 *   cudaMemset(buf, 0, 65536)
 *   2 x cudaEventRecord(e, s); cudaStreamWaitEvent(NULL, e, 0)
 *   cudaHostRegister(buf, 1048576, 0); cudaHostUnregister(buf)
 *   cudaEventDestroy(e); cudaStreamDestroy(s)
 * printing "NAME rc=N" after each.  Prototypes as in CUDA 12's cuda_runtime_api.h.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaEvent_t;

static void *sym(void *lib, const char *name)
{
    void *f = dlsym(lib, name);
    if (f == NULL) {
        fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return f;
}

int main(int argc, char **argv)
{
    static unsigned char buf[1 << 20];
    char line[16];
    cudaStream_t s = NULL;
    cudaEvent_t e = NULL;
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
    cudaError_t (*stream_create)(cudaStream_t *, unsigned int, int) = sym(lib, "cudaStreamCreateWithPriority");
    cudaError_t (*event_create)(cudaEvent_t *, unsigned int) = sym(lib, "cudaEventCreateWithFlags");
    cudaError_t (*memset_async)(void *, int, size_t, cudaStream_t) = sym(lib, "cudaMemsetAsync");
    cudaError_t (*memset_sync)(void *, int, size_t) = sym(lib, "cudaMemset");
    cudaError_t (*event_record)(cudaEvent_t, cudaStream_t) = sym(lib, "cudaEventRecord");
    cudaError_t (*wait_event)(cudaStream_t, cudaEvent_t, unsigned int) = sym(lib, "cudaStreamWaitEvent");
    cudaError_t (*host_register)(void *, size_t, unsigned int) = sym(lib, "cudaHostRegister");
    cudaError_t (*host_unregister)(void *) = sym(lib, "cudaHostUnregister");
    cudaError_t (*event_destroy)(cudaEvent_t) = sym(lib, "cudaEventDestroy");
    cudaError_t (*stream_destroy)(cudaStream_t) = sym(lib, "cudaStreamDestroy");
    printf("ready pid=%d\n", (int)getpid());
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 1;
    printf("cudaStreamCreateWithPriority rc=%d\n", stream_create(&s, 1, -1));
    printf("cudaEventCreateWithFlags rc=%d\n", event_create(&e, 2));
    for (int i = 0; i < 3; i++)
        printf("cudaMemsetAsync rc=%d\n", memset_async(buf, 0, 4096, s));
    printf("cudaMemset rc=%d\n", memset_sync(buf, 0, 65536));
    for (int i = 0; i < 2; i++)
        printf("cudaEventRecord rc=%d\n", event_record(e, s));
    printf("cudaStreamWaitEvent rc=%d\n", wait_event(NULL, e, 0));
    printf("cudaHostRegister rc=%d\n", host_register(buf, sizeof(buf), 0));
    printf("cudaHostUnregister rc=%d\n", host_unregister(buf));
    printf("cudaEventDestroy rc=%d\n", event_destroy(e));
    printf("cudaStreamDestroy rc=%d\n", stream_destroy(s));
    return 0;
}
