/* Records the CUDA runtime program (cuda.bpf.c) puts in the ring buffer, and the ids of the
 * probed API functions. Each record struct starts with a u8 type (>= 16; 1 and 2 belong to
 * common.bpf.c), has explicit padding, is zeroed before it is filled, and has exactly one
 * Python mirror in otel_ebpf/receivers/cuda/receiver.py (checked by tests/unit/test_cuda_layout.py).
 *
 * Completed calls (entry and return paired in the kernel) share the head struct cuda_call;
 * times are bpf_ktime_get_ns() (CLOCK_MONOTONIC), converted to epoch ns in Python.
 */
#ifndef OE_CUDA_H
#define OE_CUDA_H

#define CUDA_EV_MEMCPY 16
#define CUDA_EV_ALLOC 17
#define CUDA_EV_FREE 18
#define CUDA_EV_SYNC 19
#define CUDA_EV_SET_DEVICE 20
#define CUDA_EV_LAUNCH 21
#define CUDA_EV_GRAPH 22
#define CUDA_EV_KERNEL 23

/* API ids: the index into otel_ebpf/receivers/cuda/apis.py APIS (checked by the layout test).
 * _ptsz/_ptds are the per-thread-default-stream entry points (nvcc --default-stream
 * per-thread); libcudart 12.9 exports the ones listed here. */
#define CUDA_API_cudaLaunchKernel 0
#define CUDA_API_cudaLaunchKernel_ptsz 1
#define CUDA_API_cudaLaunchKernelExC 2
#define CUDA_API_cudaLaunchKernelExC_ptsz 3
#define CUDA_API_cudaMemcpy 4
#define CUDA_API_cudaMemcpy_ptds 5
#define CUDA_API_cudaMemcpyAsync 6
#define CUDA_API_cudaMemcpyAsync_ptsz 7
#define CUDA_API_cudaMalloc 8
#define CUDA_API_cudaMallocAsync 9
#define CUDA_API_cudaMallocAsync_ptsz 10
#define CUDA_API_cudaMallocManaged 11
#define CUDA_API_cudaFree 12
#define CUDA_API_cudaFreeAsync 13
#define CUDA_API_cudaFreeAsync_ptsz 14
#define CUDA_API_cudaStreamSynchronize 15
#define CUDA_API_cudaStreamSynchronize_ptsz 16
#define CUDA_API_cudaDeviceSynchronize 17
#define CUDA_API_cudaEventSynchronize 18
#define CUDA_API_cudaSetDevice 19
#define CUDA_API_cudaGraphLaunch 20
#define CUDA_API_cudaGraphLaunch_ptsz 21
/* counted only (calls, duration, bytes for memset and host register): no record */
#define CUDA_API_cudaMemset 22
#define CUDA_API_cudaMemset_ptds 23
#define CUDA_API_cudaMemsetAsync 24
#define CUDA_API_cudaMemsetAsync_ptsz 25
#define CUDA_API_cudaEventRecord 26
#define CUDA_API_cudaEventRecord_ptsz 27
#define CUDA_API_cudaEventRecordWithFlags 28
#define CUDA_API_cudaEventRecordWithFlags_ptsz 29
#define CUDA_API_cudaStreamWaitEvent 30
#define CUDA_API_cudaStreamWaitEvent_ptsz 31
#define CUDA_API_cudaStreamCreate 32
#define CUDA_API_cudaStreamCreateWithFlags 33
#define CUDA_API_cudaStreamCreateWithPriority 34
#define CUDA_API_cudaStreamDestroy 35
#define CUDA_API_cudaEventCreate 36
#define CUDA_API_cudaEventCreateWithFlags 37
#define CUDA_API_cudaEventDestroy 38
#define CUDA_API_cudaHostRegister 39
#define CUDA_API_cudaHostUnregister 40
/* the driver API (libcuda.so.1) */
#define CUDA_API_cuLaunchKernel 41
#define CUDA_API_cuLaunchKernel_ptsz 42
#define CUDA_API_cuLaunchKernelEx 43
#define CUDA_API_cuLaunchKernelEx_ptsz 44
#define CUDA_API_cuGraphLaunch 45
#define CUDA_API_cuGraphLaunch_ptsz 46
/* driver memory (cuda.bpf.c driver_mem_enter: not counted again inside a runtime malloc/free of the thread) */
#define CUDA_API_cuMemAlloc_v2 47
#define CUDA_API_cuMemAllocAsync 48
#define CUDA_API_cuMemAllocAsync_ptsz 49
#define CUDA_API_cuMemAllocManaged 50
#define CUDA_API_cuMemFree_v2 51
#define CUDA_API_cuMemFreeAsync 52
#define CUDA_API_cuMemFreeAsync_ptsz 53
#define CUDA_API_cuMemCreate 54
#define CUDA_API_cuMemRelease 55
/* kernel handles (kernel_return): one record per successful call */
#define CUDA_API___cudaGetKernel 56
#define CUDA_API_cudaGetFuncBySymbol 57
#define CUDA_API_cuModuleGetFunction 58
#define CUDA_API_cuLibraryGetKernel 59
/* stream capture (capture_begin_return / capture_end_return): counted, and the thread's open captures kept */
#define CUDA_API_cudaStreamBeginCapture 60
#define CUDA_API_cudaStreamBeginCapture_ptsz 61
#define CUDA_API_cudaStreamBeginCaptureToGraph 62
#define CUDA_API_cudaStreamBeginCaptureToGraph_ptsz 63
#define CUDA_API_cudaStreamEndCapture 64
#define CUDA_API_cudaStreamEndCapture_ptsz 65
/* driver copies (driver_memcpy_enter: not counted again inside a runtime cudaMemcpy* of the thread) */
#define CUDA_API_cuMemcpy 66
#define CUDA_API_cuMemcpyAsync 67
#define CUDA_API_cuMemcpyHtoD_v2 68
#define CUDA_API_cuMemcpyDtoH_v2 69
#define CUDA_API_cuMemcpyDtoD_v2 70
#define CUDA_API_cuMemcpyHtoDAsync_v2 71
#define CUDA_API_cuMemcpyDtoHAsync_v2 72
#define CUDA_API_cuMemcpyDtoDAsync_v2 73
/* driver virtual-memory mappings (count_return): counted, with the bytes mapped and unmapped */
#define CUDA_API_cuMemMap 74
#define CUDA_API_cuMemUnmap 75
/* the current device of a thread that chose it before the agent attached (get_device_return): learned, no record */
#define CUDA_API_cudaGetDevice 76
#define CUDA_API_COUNT 77

#define CUDA_KERNEL_NAME_LEN 160

/* The call's enclosing Python function / PyTorch operator (ctx_kind) */
#define CUDA_CTX_NONE 0
#define CUDA_CTX_PYTHON 1  /* == OE_CTX_PYTHON (common.bpf.c) */
#define CUDA_CTX_TORCH 2   /* == OE_CTX_TORCH */

/* Head of every completed-call record. 56 bytes. */
struct cuda_call {
    u8 type;
    u8 api;            /* CUDA_API_* */
    u8 ctx_kind;       /* CUDA_CTX_*: the innermost traced call open on the thread at entry */
    u8 captured;       /* 1: made while the thread had a stream capture open (recorded into a graph, not run) */
    s32 device;        /* thread's device from cudaSetDevice; 0 (CUDA's default) when none seen */
    u32 pid;
    u32 tid;
    u64 start_ns;      /* uprobe */
    u64 end_ns;        /* uretprobe */
    s32 rc;            /* cudaError_t returned */
    u32 _pad2;
    u64 ctx_start;     /* that call's start_ns (its id in the thread); 0: none */
    u64 ctx_root;      /* start_ns of the outermost open call of that kind (its trace) */
};

/* cudaMemcpy(dst, src, count, kind) / cudaMemcpyAsync(dst, src, count, kind, stream) */
struct cuda_memcpy_rec {
    struct cuda_call call;
    u64 dst;
    u64 src;
    u64 bytes;
    u64 stream;        /* 0 for the synchronous variants */
    u32 kind;          /* cudaMemcpyKind */
    u32 _pad;
};

/* cudaMalloc(&p, size) / cudaMallocAsync(&p, size, stream) / cudaMallocManaged(&p, size, flags) */
struct cuda_alloc_rec {
    struct cuda_call call;
    u64 ptr;           /* *devPtr after a successful call; 0 when rc != 0 */
    u64 size;
    u64 stream;        /* cudaMallocAsync only */
    u32 flags;         /* cudaMallocManaged only */
    u32 _pad;
};

/* cudaFree(p) / cudaFreeAsync(p, stream) */
struct cuda_free_rec {
    struct cuda_call call;
    u64 ptr;
    u64 stream;
};

/* cudaStreamSynchronize(stream) / cudaDeviceSynchronize() / cudaEventSynchronize(event) */
struct cuda_sync_rec {
    struct cuda_call call;
    u64 handle;        /* the stream or event; 0 for cudaDeviceSynchronize */
};

/* cudaGraphLaunch(graphExec, stream): one replay of an instantiated CUDA graph (every kernel, copy and
 * NCCL operation captured in it runs on the GPU without passing any other probed call) */
struct cuda_graph_rec {
    struct cuda_call call;
    u64 exec;          /* the cudaGraphExec_t */
    u64 stream;
};

/* cudaSetDevice(device); the binding is committed (call.device) only when rc == 0 */
struct cuda_set_device_rec {
    struct cuda_call call;
    s32 requested;
    u32 _pad;
};

/* A sampled kernel launch (entry only: launches are otherwise counted in-kernel). 96 bytes. */
struct cuda_launch_rec {
    u8 type;
    u8 api;
    u8 ctx_kind;       /* as in cuda_call */
    u8 captured;       /* as in cuda_call */
    s32 device;
    u32 pid;
    u32 tid;
    u64 ts;
    u64 func;          /* host stub address passed as `func` */
    u32 grid[3];
    u32 block[3];
    u64 shared_mem;    /* dynamic shared memory bytes */
    u64 stream;
    u64 seq;           /* this launch's number in its process (1-based) */
    u64 ctx_start;     /* as in cuda_call */
    u64 ctx_root;
};

/* A kernel handle made (kernel_return in cuda.bpf.c): the `func` later launches pass. 184 bytes. */
struct cuda_kernel_rec {
    u8 type;
    u8 api;            /* CUDA_API___cudaGetKernel, _cudaGetFuncBySymbol, _cuModuleGetFunction, _cuLibraryGetKernel */
    u16 _pad;
    u32 pid;
    u64 handle;        /* the cudaKernel_t / cudaFunction_t / CUfunction / CUkernel the call made */
    u64 host_fun;      /* runtime: the host function it stands for (symbolized by the agent); driver: 0 */
    char name[CUDA_KERNEL_NAME_LEN]; /* driver: the function name asked for (cut at 159 bytes); runtime: empty */
};

#endif /* OE_CUDA_H */
