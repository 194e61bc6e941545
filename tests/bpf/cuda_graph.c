/*
 * cuda_graph: replays "CUDA graphs" through a libcudart's cudaGraphLaunch, as a graph-replaying caller does
 * (torch.cuda.CUDAGraph.replay, vLLM/SGLang decode steps: cudaGraphLaunch(exec, stream) once per step, on the
 * real prototype of cuda_runtime_api.h: cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t)).  The
 * handles are made up (no driver here: the real runtime returns 35 before touching them; the stand-in
 * returns 0), and printed so the test knows them.
 *
 *   cuda_graph LIB N   dlopen LIB, print "ready pid=P", wait for a line on stdin, then call
 *                      cudaGraphLaunch((cudaGraphExec_t)(0x6000 + i), (cudaStream_t)0x77) for i < N,
 *                      printing "cudaGraphLaunch rc=R" for each.
 * Exit: 0, or 2 on a dlopen/dlsym error.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*graph_launch_fn)(void *exec, void *stream);

int main(int argc, char **argv)
{
    char line[16];
    if (argc != 3) {
        fprintf(stderr, "usage: %s LIBCUDART N\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    graph_launch_fn launch = lib != NULL ? (graph_launch_fn)dlsym(lib, "cudaGraphLaunch") : NULL;
    if (launch == NULL) {
        fprintf(stderr, "%s: %s\n", argv[1], dlerror());
        return 2;
    }
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    if (fgets(line, sizeof(line), stdin) == NULL)
        return 0;
    for (long i = 0, n = atol(argv[2]); i < n; i++)
        printf("cudaGraphLaunch rc=%d\n", launch((void *)(uintptr_t)(0x6000 + i), (void *)(uintptr_t)0x77));
    return 0;
}
