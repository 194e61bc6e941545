"""Typed events of the CUDA runtime receiver: one frozen dataclass per kind.

Times are Unix epoch nanoseconds (already converted from kernel monotonic time). ``api`` is
the exact symbol that was called (``cudaMemcpyAsync`` or its per-thread-default-stream twin
``cudaMemcpyAsync_ptsz``). ``device`` is the calling thread's device as bound by the last
successful ``cudaSetDevice`` seen on that thread, or 0 when none was seen (CUDA's default device
for a host thread; a process whose runtime cannot start has no device, and its calls fail). ``rc`` is the
``cudaError_t`` the call returned. Pointers and handles are plain ints. ``enclosing`` is the
traced Python function or PyTorch operator the thread was in when the call began (None: none,
or the python/torch receivers are not running). ``captured``: made while the thread had a CUDA stream capture
open (``cudaStreamBeginCapture``..``cudaStreamEndCapture``): the work was recorded into a graph, not run; it runs
at each ``cudaGraphLaunch`` of that graph, which no other probe sees.
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = [
    "NO_DEVICE",
    "AllocCall",
    "CallStats",
    "CudaCall",
    "EnclosingCall",
    "FreeCall",
    "GraphLaunchCall",
    "KernelLaunch",
    "KernelLaunchStats",
    "MemcpyCall",
    "SetDeviceCall",
    "SyncCall",
]

NO_DEVICE = -1


@fast_init
@dataclass(frozen=True, slots=True)
class EnclosingCall:
    """The innermost traced call open on the thread: ``kind`` ``"python"`` (a PythonCall of the
    python receiver) or ``"torch"`` (a TorchOp); ``start_ns`` is that call's start (its id in
    the thread, epoch ns as in its own event) and ``root_ns`` the start of the outermost open
    call of that kind (its trace)."""

    kind: str
    start_ns: int
    root_ns: int


@fast_init
@dataclass(frozen=True, slots=True)
class MemcpyCall:
    """cudaMemcpy / cudaMemcpyAsync. ``kind`` is the cudaMemcpyKind (0..4); ``stream`` is 0
    for the synchronous variants."""

    pid: int
    tid: int
    api: str
    device: int
    start_ns: int
    end_ns: int
    rc: int
    dst: int
    src: int
    bytes: int
    stream: int
    kind: int
    enclosing: EnclosingCall | None = None
    captured: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class AllocCall:
    """cudaMalloc / cudaMallocAsync / cudaMallocManaged, and the driver's cuMemAlloc_v2 / cuMemAllocAsync /
    cuMemAllocManaged / cuMemCreate (``ptr``: its CUmemGenericAllocationHandle; ``device``: the device its
    CUmemAllocationProp names). ``ptr`` is 0 unless rc == 0."""

    pid: int
    tid: int
    api: str
    device: int
    start_ns: int
    end_ns: int
    rc: int
    ptr: int
    size: int
    stream: int
    flags: int
    enclosing: EnclosingCall | None = None
    captured: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class FreeCall:
    """cudaFree / cudaFreeAsync, and the driver's cuMemFree_v2 / cuMemFreeAsync / cuMemRelease (``ptr``: the
    handle). The size is not an argument: the processor knows it from the allocation, when it saw that."""

    pid: int
    tid: int
    api: str
    device: int
    start_ns: int
    end_ns: int
    rc: int
    ptr: int
    stream: int
    enclosing: EnclosingCall | None = None
    captured: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class SyncCall:
    """cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize: the host waits
    for the GPU. ``handle`` is the stream or event (0 for cudaDeviceSynchronize)."""

    pid: int
    tid: int
    api: str
    device: int
    start_ns: int
    end_ns: int
    rc: int
    handle: int
    enclosing: EnclosingCall | None = None
    captured: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class GraphLaunchCall:
    """cudaGraphLaunch(exec, stream) (or its _ptsz twin): one replay of an instantiated CUDA graph. The work
    captured in the graph (kernels, copies, NCCL operations) runs on the GPU without passing any other probed
    call, so this call is all the host side shows of it."""

    pid: int
    tid: int
    api: str
    device: int
    start_ns: int
    end_ns: int
    rc: int
    exec: int
    stream: int
    enclosing: EnclosingCall | None = None
    captured: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class SetDeviceCall:
    """cudaSetDevice(requested). ``device`` is the binding after the call (== requested when
    rc == 0)."""

    pid: int
    tid: int
    api: str
    device: int
    start_ns: int
    end_ns: int
    rc: int
    requested: int
    enclosing: EnclosingCall | None = None
    captured: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class KernelLaunch:
    """One sampled launch (every ``launch_sample_every``-th of its process), at its entry.
    ``seq`` is its 1-based number in the process. The return code is not known (entry only)."""

    pid: int
    tid: int
    api: str
    device: int
    time_ns: int
    func: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    stream: int
    seq: int
    enclosing: EnclosingCall | None = None
    captured: bool = False
    kernel: str = ""  # the kernel's short name (receiver kernel_names; "": unknown)


@fast_init
@dataclass(frozen=True, slots=True)
class KernelLaunchStats:
    """``count`` more launches since the previous read, of kernels with ``grid_size`` blocks
    of ``block_size`` threads, by process ``pid`` on ``device``. ``time_ns`` is when the
    in-kernel counters were read. ``op`` names the PyTorch operator the launches were made in
(receiver ``launch_context`` with the torch receiver running). ``kernel`` names the kernel (receiver
``kernel_names``): its qualified name without template arguments, from the symbol table of the file that holds
its host function, or the name the driver was asked for (Triton's ``triton_poi_fused_add_0``)."""

    pid: int
    device: int
    grid_size: int
    block_size: int
    count: int
    time_ns: int
    op: str = ""  # the PyTorch operator the launches were made in ("": none or unknown)
    api: str = ""  # the entry point that counted them: cudaLaunchKernel*, or cuLaunchKernel* (the driver)
    kernel: str = ""  # the launched kernel's short name, ``at::native::elementwise_kernel`` ("": unknown or off)
    captured: bool = False  # recorded into a CUDA graph during a stream capture, not run


CudaCall = MemcpyCall | AllocCall | FreeCall | SyncCall | SetDeviceCall | GraphLaunchCall


@fast_init
@dataclass(frozen=True, slots=True)
class CallStats:
    """In-kernel accounting of cudaMemcpy* / cuda*Synchronize calls of one process since the
    last read (deltas), for one (api, device, rc, kind): ``calls`` made, ``limited`` of them
    left without a record by the span rate limit, summed ``dur_ns`` and ``bytes`` (memcpy), and
    histogram bucket counts over the emitter's bounds (:func:`otel_ebpf.core.buckets.bounds_for_unit`:
    ``"s"`` for durations, ``"By"`` for bytes; ``bytes_hist`` is all zeros for synchronize).
    ``kind`` is the cudaMemcpyKind (0 for synchronize). ``time_ns``: when it was read."""

    pid: int
    api: str
    device: int
    rc: int
    kind: int
    calls: int
    limited: int
    dur_ns: int
    bytes: int
    dur_hist: tuple[int, ...]
    bytes_hist: tuple[int, ...]
    time_ns: int
    captured: bool = False  # calls made during a stream capture (recorded into a graph, not run)
