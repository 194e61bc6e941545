"""Typed events of the CUDA runtime receiver: one frozen dataclass per kind.

Times are Unix epoch nanoseconds (already converted from kernel monotonic time). ``api`` is
the exact symbol that was called (``cudaMemcpyAsync`` or its per-thread-default-stream twin
``cudaMemcpyAsync_ptsz``). ``device`` is the calling thread's device as bound by the last
successful ``cudaSetDevice`` seen on that thread, or -1 when none was seen. ``rc`` is the
``cudaError_t`` the call returned. Pointers and handles are plain ints.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "NO_DEVICE",
    "AllocCall",
    "CudaCall",
    "FreeCall",
    "KernelLaunch",
    "KernelLaunchStats",
    "MemcpyCall",
    "SetDeviceCall",
    "SyncCall",
]

NO_DEVICE = -1


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


@dataclass(frozen=True, slots=True)
class AllocCall:
    """cudaMalloc / cudaMallocAsync / cudaMallocManaged. ``ptr`` is 0 unless rc == 0."""

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


@dataclass(frozen=True, slots=True)
class FreeCall:
    """cudaFree / cudaFreeAsync. The size is not an argument: the processor knows it from the
    allocation, when it saw that."""

    pid: int
    tid: int
    api: str
    device: int
    start_ns: int
    end_ns: int
    rc: int
    ptr: int
    stream: int


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


@dataclass(frozen=True, slots=True)
class KernelLaunchStats:
    """``count`` more launches since the previous read, of kernels with ``grid_size`` blocks
    of ``block_size`` threads, by process ``pid`` on ``device``. ``time_ns`` is when the
    in-kernel counters were read."""

    pid: int
    device: int
    grid_size: int
    block_size: int
    count: int
    time_ns: int


CudaCall = MemcpyCall | AllocCall | FreeCall | SyncCall | SetDeviceCall
