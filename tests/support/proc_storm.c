/*
 * proc_storm: process and thread lifecycle load on a CUDA runtime (libcudart.so.12), for the
 * fault suite (tests/faults/test_load.py).  Every mode makes a KNOWN number of runtime calls, so
 * a test can reconcile calls with spans exported + drops counted.  No GPU needed: without a
 * driver the real libcudart returns 35 from every call and the uprobes still fire.
 *
 * Usage:
 *   proc_storm LIB fork N [PARALLEL]   fork N children (at most PARALLEL alive, default 8); each
 *                                      calls cudaMemcpy once and _exits.  The parent calls nothing.
 *   proc_storm LIB threads N K         N threads alive at once (barrier), each calls cudaMalloc and
 *                                      cudaMemcpy K times.
 *   proc_storm LIB exec N              call cudaMemcpy once, then execv itself with N-1 (same pid,
 *                                      a fresh image and a fresh dlopen of LIB each time), until 0.
 * Output: one line "proc_storm MODE calls=C wall_ms=W" (exec: printed by the last image, wall
 * time since the first image via the environment variable PROC_STORM_T0_NS).  The wall time starts once the
 * first image has loaded LIB: under `otel-ebpf run`'s deferred start that open is held until the CUDA receiver
 * has compiled (seconds, varying with what compiles before it), which is not the calls' cost.
 * Exit status 0, 1 on usage/dlopen errors, 2 when a child or thread failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*memcpy_fn)(void *, const void *, size_t, int);
typedef int (*malloc_fn)(void **, size_t);

static memcpy_fn cuda_memcpy;
static malloc_fn cuda_malloc;
static pthread_barrier_t barrier;
static long per_thread;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long parse(const char *s)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || v < 0) {
        fprintf(stderr, "bad number '%s'\n", s);
        exit(1);
    }
    return v;
}

static void load(const char *path)
{
    void *lib = dlopen(path, RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
        exit(1);
    }
    cuda_memcpy = (memcpy_fn)dlsym(lib, "cudaMemcpy");
    cuda_malloc = (malloc_fn)dlsym(lib, "cudaMalloc");
    if (cuda_memcpy == NULL || cuda_malloc == NULL) {
        fprintf(stderr, "dlsym: %s\n", dlerror());
        exit(1);
    }
}

static int fork_mode(long n, long parallel)
{
    static char buf[4096];
    long started = 0, alive = 0, failed = 0;
    int status;
    while (started < n || alive > 0) {
        if (started < n && alive < parallel) {
            pid_t pid = fork();
            if (pid == 0) {
                cuda_memcpy(buf, buf, sizeof(buf), 1);
                _exit(0);
            }
            if (pid < 0) {
                perror("fork");
                return 2;
            }
            started++, alive++;
            continue;
        }
        if (wait(&status) > 0) {
            alive--;
            failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
    }
    return failed ? 2 : 0;
}

static void *thread_main(void *arg)
{
    static char buf[4096];
    void *p = NULL;
    (void)arg;
    pthread_barrier_wait(&barrier); /* all N threads exist before any calls */
    for (long i = 0; i < per_thread; i++) {
        cuda_malloc(&p, 4096);
        cuda_memcpy(buf, buf, sizeof(buf), 1);
    }
    return NULL;
}

static int threads_mode(long n)
{
    pthread_t *ths = calloc((size_t)n, sizeof(*ths));
    pthread_attr_t attr;
    if (ths == NULL)
        return 2;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_barrier_init(&barrier, NULL, (unsigned)n);
    for (long i = 0; i < n; i++)
        if (pthread_create(&ths[i], &attr, thread_main, NULL) != 0) {
            fprintf(stderr, "pthread_create %ld failed\n", i);
            return 2;
        }
    for (long i = 0; i < n; i++)
        pthread_join(ths[i], NULL);
    free(ths);
    return 0;
}

int main(int argc, char **argv)
{
    static char buf[4096];
    int rc = 0;
    if (argc < 4) {
        fprintf(stderr, "usage: %s LIB fork N [PARALLEL] | threads N K | exec N\n", argv[0]);
        return 1;
    }
    load(argv[1]);
    long long t0 = now_ns();  /* after the load: see the top */
    long n = parse(argv[3]);
    if (strcmp(argv[2], "fork") == 0) {
        rc = fork_mode(n, argc > 4 ? parse(argv[4]) : 8);
        printf("proc_storm fork calls=%ld wall_ms=%lld\n", n, (now_ns() - t0) / 1000000);
    } else if (strcmp(argv[2], "threads") == 0 && argc > 4) {
        per_thread = parse(argv[4]);
        rc = threads_mode(n);
        printf("proc_storm threads calls=%ld wall_ms=%lld\n", 2 * n * per_thread, (now_ns() - t0) / 1000000);
    } else if (strcmp(argv[2], "exec") == 0) {
        const char *first = getenv("PROC_STORM_T0_NS");
        char next[32], t0s[32];
        cuda_memcpy(buf, buf, sizeof(buf), 1);
        if (first == NULL) {
            snprintf(t0s, sizeof(t0s), "%lld", t0);
            setenv("PROC_STORM_T0_NS", t0s, 1);
            first = t0s;
        }
        if (n > 1) {
            snprintf(next, sizeof(next), "%ld", n - 1);
            execl("/proc/self/exe", argv[0], argv[1], "exec", next, (char *)NULL);
            perror("execl");
            return 2;
        }
        /* every image made one call: the count is the number of images, known to the caller */
        printf("proc_storm exec calls=1 wall_ms=%lld\n", (now_ns() - atoll(first)) / 1000000);
    } else {
        fprintf(stderr, "unknown mode %s\n", argv[2]);
        return 1;
    }
    fflush(stdout);
    return rc;
}
