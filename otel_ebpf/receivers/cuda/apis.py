"""The probed CUDA entry points: one :class:`Api` per symbol, in the order of their CUDA_API_* ids (cuda.h,
checked by tests/unit/receivers/test_cuda_layout.py), and the probes each library gets from them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from otel_ebpf.bpf.receiver import Probe

__all__ = ["APIS", "DRIVER_PROBES", "PROBES", "Api", "ApiKind"]

ApiKind = Literal["launch", "launch_exc", "memcpy", "alloc", "free", "sync", "set_device", "get_device", "graph",
                  "count", "kernel", "capture"]


@dataclass(frozen=True)
class Api:
    """A probed libcudart symbol; its index in :data:`APIS` is its CUDA_API_* id in cuda.h."""

    symbol: str
    kind: ApiKind
    optional: bool = False  # per-thread-default-stream variants: absent from some builds
    library: Literal["runtime", "driver"] = "runtime"  # libcudart.so.* or libcuda.so.1


APIS: tuple[Api, ...] = (
    Api("cudaLaunchKernel", "launch"),
    Api("cudaLaunchKernel_ptsz", "launch", True),
    Api("cudaLaunchKernelExC", "launch_exc"),
    Api("cudaLaunchKernelExC_ptsz", "launch_exc", True),
    Api("cudaMemcpy", "memcpy"),
    Api("cudaMemcpy_ptds", "memcpy", True),
    Api("cudaMemcpyAsync", "memcpy"),
    Api("cudaMemcpyAsync_ptsz", "memcpy", True),
    Api("cudaMalloc", "alloc"),
    Api("cudaMallocAsync", "alloc"),
    Api("cudaMallocAsync_ptsz", "alloc", True),
    Api("cudaMallocManaged", "alloc"),
    Api("cudaFree", "free"),
    Api("cudaFreeAsync", "free"),
    Api("cudaFreeAsync_ptsz", "free", True),
    Api("cudaStreamSynchronize", "sync"),
    Api("cudaStreamSynchronize_ptsz", "sync", True),
    Api("cudaDeviceSynchronize", "sync"),
    Api("cudaEventSynchronize", "sync"),
    Api("cudaSetDevice", "set_device"),
    Api("cudaGraphLaunch", "graph"),
    Api("cudaGraphLaunch_ptsz", "graph", True),
    # counted only (count_return in cuda.bpf.c): OBI's set of memset, event, stream and host-register calls
    Api("cudaMemset", "count"),
    Api("cudaMemset_ptds", "count", True),
    Api("cudaMemsetAsync", "count"),
    Api("cudaMemsetAsync_ptsz", "count", True),
    Api("cudaEventRecord", "count"),
    Api("cudaEventRecord_ptsz", "count", True),
    Api("cudaEventRecordWithFlags", "count"),
    Api("cudaEventRecordWithFlags_ptsz", "count", True),
    Api("cudaStreamWaitEvent", "count"),
    Api("cudaStreamWaitEvent_ptsz", "count", True),
    Api("cudaStreamCreate", "count"),
    Api("cudaStreamCreateWithFlags", "count"),
    Api("cudaStreamCreateWithPriority", "count"),
    Api("cudaStreamDestroy", "count"),
    Api("cudaEventCreate", "count"),
    Api("cudaEventCreateWithFlags", "count"),
    Api("cudaEventDestroy", "count"),
    Api("cudaHostRegister", "count"),
    Api("cudaHostUnregister", "count"),
    # the driver API, on libcuda.so.1 (DRIVER_PROBES): launches not made through a probed libcudart. Only
    # cuLaunchKernel is needed: cuLaunchKernelEx came with CUDA 11.8 drivers, and a libcuda that is not NVIDIA's
    # (the twin's stub: what torch imports) may lack the rest
    Api("cuLaunchKernel", "launch", library="driver"),
    Api("cuLaunchKernel_ptsz", "launch", True, library="driver"),
    Api("cuLaunchKernelEx", "launch_exc", True, library="driver"),
    Api("cuLaunchKernelEx_ptsz", "launch_exc", True, library="driver"),
    Api("cuGraphLaunch", "graph", True, library="driver"),
    Api("cuGraphLaunch_ptsz", "graph", True, library="driver"),
    # driver memory: what is allocated without the runtime (CuPy, Numba, vLLM's cumem allocator) and PyTorch's
    # expandable segments (cuMemCreate/cuMemRelease of physical chunks, mapped with cuMemMap); optional, as a
    # libcuda that is not NVIDIA's may lack them
    Api("cuMemAlloc_v2", "alloc", True, library="driver"),
    Api("cuMemAllocAsync", "alloc", True, library="driver"),
    Api("cuMemAllocAsync_ptsz", "alloc", True, library="driver"),
    Api("cuMemAllocManaged", "alloc", True, library="driver"),
    Api("cuMemFree_v2", "free", True, library="driver"),
    Api("cuMemFreeAsync", "free", True, library="driver"),
    Api("cuMemFreeAsync_ptsz", "free", True, library="driver"),
    Api("cuMemCreate", "alloc", True, library="driver"),
    Api("cuMemRelease", "free", True, library="driver"),
    # kernel handles (kernel_return): what a launch's func stands for, so launches are counted per kernel name.
    # __cudaGetKernel: nvcc 13's <<<>>> (CUDA 13.0: CUPTI's __cudaGetKernel_v13000); cudaGetFuncBySymbol: CUDA 11+;
    # the driver's: Triton (cuModuleGetFunction)
    Api("__cudaGetKernel", "kernel", True),
    Api("cudaGetFuncBySymbol", "kernel", True),
    Api("cuModuleGetFunction", "kernel", True, library="driver"),
    Api("cuLibraryGetKernel", "kernel", True, library="driver"),
    # stream capture: counted, and while one is open the thread's launches and calls are marked captured
    Api("cudaStreamBeginCapture", "capture"),
    Api("cudaStreamBeginCapture_ptsz", "capture", True),
    Api("cudaStreamBeginCaptureToGraph", "capture", True),  # CUDA 12.3+
    Api("cudaStreamBeginCaptureToGraph_ptsz", "capture", True),
    Api("cudaStreamEndCapture", "capture"),
    Api("cudaStreamEndCapture_ptsz", "capture", True),
    # driver copies: JAX/XLA and Numba copy with the typed entry points, CuPy and Numba with cuMemcpy(Async); a
    # runtime cudaMemcpy* that reaches them is counted once, as the runtime call (cuda.bpf.c driver_memcpy_enter)
    Api("cuMemcpy", "memcpy", True, library="driver"),
    Api("cuMemcpyAsync", "memcpy", True, library="driver"),
    Api("cuMemcpyHtoD_v2", "memcpy", True, library="driver"),
    Api("cuMemcpyDtoH_v2", "memcpy", True, library="driver"),
    Api("cuMemcpyDtoD_v2", "memcpy", True, library="driver"),
    Api("cuMemcpyHtoDAsync_v2", "memcpy", True, library="driver"),
    Api("cuMemcpyDtoHAsync_v2", "memcpy", True, library="driver"),
    Api("cuMemcpyDtoDAsync_v2", "memcpy", True, library="driver"),
    # virtual-memory mappings of physical chunks (expandable segments map each cuMemCreate'd chunk): counted
    Api("cuMemMap", "count", True, library="driver"),
    Api("cuMemUnmap", "count", True, library="driver"),
    # a thread's device, learned only for a window after attaching to processes already running (.learning)
    Api("cudaGetDevice", "get_device", True),
)
_SYMBOLS = tuple(a.symbol for a in APIS)


def _probes(library: str) -> tuple[Probe, ...]:
    # Launches are entry-only: the cost lands on the caller, no uretprobe trampoline.
    return tuple(Probe(a.symbol, entry=f"enter_{a.symbol}",
                       ret=None if a.kind.startswith("launch") else f"return_{a.symbol}", optional=a.optional)
                 for a in APIS if a.library == library and a.kind != "get_device")


PROBES = _probes("runtime")  # on each libcudart.so.*
DRIVER_PROBES = _probes("driver")  # on each libcuda.so.* (the driver)
