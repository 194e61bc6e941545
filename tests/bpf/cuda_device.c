/*
 * cuda_device: threads that chose their device BEFORE the agent attached (run --pid, an agent restart), for
 * tests/bpf/test_cuda_device.py.  Calls are made as PyTorch makes them: a thread sets its device once
 * (c10::cuda::set_device -> cudaSetDevice), then asks for it around its work (c10::cuda::current_device ->
 * cudaGetDevice), and launches.
 *
 * Usage: cuda_device LIBCUDART
 * Before "ready pid=P": main sets device 1, thread B sets device 2 (both unseen by an agent that attaches later).
 * Line 1 on stdin ("go"):  main: cudaGetDevice, launch grid 1;  B: launch grid 2 (no cudaGetDevice).
 *                          prints "phase1 done".
 * Line 2 on stdin (after the agent's learning window): main: launch grid 4; B: cudaGetDevice, launch grid 3.
 * Prints "NAME rc=N" after each call made after "ready" (a failed cudaSetDevice before it exits 1).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct { unsigned int x, y, z; } dim3;
typedef int (*set_device_t)(int);
typedef int (*get_device_t)(int *);
typedef int (*launch_t)(const void *, dim3, dim3, void **, size_t, void *);

static set_device_t set_device;
static get_device_t get_device;
static launch_t launch;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int phase, b_done = -1;  /* phase: what main asked B to do; b_done: the last phase B finished */

static void fake_kernel(void) {}

static void launch_grid(unsigned int grid)
{
    dim3 g = {grid, 1, 1}, b = {32, 1, 1};
    printf("launch rc=%d\n", launch((const void *)fake_kernel, g, b, NULL, 0, NULL));
}

static void *thread_b(void *arg)
{
    (void)arg;
    if (set_device(2) != 0)
        exit(1);
    pthread_mutex_lock(&mu);
    b_done = 0;
    pthread_cond_broadcast(&cv);
    for (int which = 1; which <= 2; which++) {
        while (phase < which)
            pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
        if (which == 2) {
            int d = -1;
            printf("cudaGetDevice rc=%d\n", get_device(&d));
        }
        launch_grid(which == 1 ? 2 : 3);
        pthread_mutex_lock(&mu);
        b_done = which;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

static void run_b(int which)
{
    pthread_mutex_lock(&mu);
    phase = which;
    pthread_cond_broadcast(&cv);
    while (b_done < which)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: cuda_device LIBCUDART\n");
        return 2;
    }
    void *rt = dlopen(argv[1], RTLD_NOW);
    if (rt == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    set_device = (set_device_t)dlsym(rt, "cudaSetDevice");
    get_device = (get_device_t)dlsym(rt, "cudaGetDevice");
    launch = (launch_t)dlsym(rt, "cudaLaunchKernel");
    if (set_device == NULL || get_device == NULL || launch == NULL)
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (set_device(1) != 0)
        return 1;
    pthread_t b;
    if (pthread_create(&b, NULL, thread_b, NULL) != 0)
        return 1;
    pthread_mutex_lock(&mu);
    while (b_done < 0)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    printf("ready pid=%d\n", getpid());

    char line[16];
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 1;
    int d = -1;
    int rc = get_device(&d);
    printf("cudaGetDevice rc=%d device=%d\n", rc, d);
    launch_grid(1);
    run_b(1);
    printf("phase1 done\n");

    if (fgets(line, sizeof(line), stdin) == NULL)
        return 1;
    launch_grid(4);
    run_b(2);
    pthread_join(b, NULL);
    return 0;
}
