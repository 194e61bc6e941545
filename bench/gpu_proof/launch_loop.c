/* GPU proof probe-cost loop: N cudaLaunchKernel calls on the libcudart a job really uses (argv[1]).
 *   launch_loop LIB N
 * Unlike bench/cuda_loop.c it initialises the CUDA context first (cudaFree(NULL)) and makes 1000 warm-up calls
 * before it prints "ready" and waits for a line on stdin, so on a real GPU the context's creation (~1 s) is not
 * in the timed loop. The launched "kernel" is this program's main, a host function: the runtime returns
 * cudaErrorInvalidDeviceFunction (98) after its checks and launches nothing, so what is timed is the API call and
 * the probes on it, not GPU work. Prints "ns_per_call=X rc=R calls=N" (CLOCK_MONOTONIC around the loop). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_t)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*free_t)(void *);

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIB N\n", argv[0]);
        return 1;
    }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    launch_t launch = (launch_t)dlsym(h, "cudaLaunchKernel");
    free_t cfree = (free_t)dlsym(h, "cudaFree");
    if (!launch || !cfree)
        return 1;
    long n = atol(argv[2]);
    int rc0 = cfree(NULL);
    dim3 g = {128, 1, 1}, b = {256, 1, 1};
    int rc = 0;
    for (int i = 0; i < 1000; i++)
        rc |= launch((const void *)main, g, b, NULL, 0, NULL);
    char line[16];
    printf("ready init_rc=%d warm_rc=%d\n", rc0, rc);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 1;
    rc = 0;
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        rc |= launch((const void *)main, g, b, NULL, 0, NULL);
    double dt = now_ns() - t0;
    printf("ns_per_call=%.1f rc=%d calls=%ld\n", dt / n, rc, n);
    return 0;
}
