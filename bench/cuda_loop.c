/* Benchmark load generator: N calls of one CUDA runtime API on the REAL libcudart (argv[1]).
 *   cuda_loop LIB launch|memcpy|malloc N [--wait-stdin] [--rate CALLS_PER_S]
 * Prints "ns_per_call=X" measured with CLOCK_MONOTONIC around the loop. Without a GPU every
 * call returns 35 (cudaErrorInsufficientDriver) after doing its argument checks: the probe
 * cost measured is the same as on a GPU machine, the work inside the call is not. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_t)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*memcpy_t)(void *, const void *, size_t, int);
typedef int (*malloc_t)(void **, size_t);

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s LIB launch|memcpy|malloc N [--wait-stdin]\n", argv[0]);
        return 1;
    }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    long n = atol(argv[3]);
    double rate = 0; /* calls per second; 0 = as fast as possible */
    int wait = 0;
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--wait-stdin") == 0)
            wait = 1;
        else if (strcmp(argv[i], "--rate") == 0 && i + 1 < argc)
            rate = atof(argv[++i]);
    }
    if (wait) {
        char line[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 1;
    }
    launch_t launch = (launch_t)dlsym(h, "cudaLaunchKernel");
    memcpy_t cpy = (memcpy_t)dlsym(h, "cudaMemcpy");
    malloc_t mal = (malloc_t)dlsym(h, "cudaMalloc");
    static char src[4096], dst[4096];
    void *p;
    dim3 g = {128, 1, 1}, b = {256, 1, 1};
    int rc = 0;
    double t0 = now_ns();
    int api = strcmp(argv[2], "launch") == 0 ? 0 : strcmp(argv[2], "memcpy") == 0 ? 1 : 2;
    for (long i = 0; i < n; i++) {
        if (rate > 0)
            while (now_ns() - t0 < i * 1e9 / rate)
                ; /* paced: spin until this call's slot */
        if (api == 0)
            rc |= launch((const void *)main, g, b, NULL, 0, NULL);
        else if (api == 1)
            rc |= cpy(dst, src, sizeof src, 1);
        else
            rc |= mal(&p, 1 << 20);
    }
    double dt = now_ns() - t0;
    printf("ns_per_call=%.1f rc=%d calls=%ld\n", dt / n, rc, n);
    return 0;
}
