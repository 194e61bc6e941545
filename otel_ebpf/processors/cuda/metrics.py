"""The CUDA processor's metrics: names, kinds, units and what each counts.

Metrics (scope ``otel_ebpf.cuda``; OBI's ``gpu.cuda.*`` names where OBI has one):

* ``gpu.cuda.kernel.launch.calls`` counter {call}; ``gpu.cuda.kernel.grid.size`` (blocks) and
  ``gpu.cuda.kernel.block.size`` (threads per block) histograms; by cuda.device.index. The launch counter
  also by ``cuda.kernel.name`` (receiver ``kernel_names``): the kernel's qualified name without template
  arguments (``at::native::vectorized_elementwise_kernel``, ``triton_poi_fused_add_0``), at most
  ``kernel_name_limit`` names per process with the rest as ``other`` (:mod:`.kernels`); absent when the kernel
  could not be named.
* ``gpu.cuda.memory.copies`` histogram By, by cuda.memcpy.kind, cuda.device.index (its count
  is the number of copies, its sum the bytes). Successful calls only. The runtime's ``cudaMemcpy*`` and the
  driver's ``cuMemcpy``, ``cuMemcpyAsync`` and typed ``cuMemcpy{HtoD,DtoH,DtoD}[Async]_v2`` (JAX/XLA, Numba,
  CuPy); a runtime copy that reaches the driver is counted once, as the runtime call. The driver's typed entry
  points name the kind; ``cuMemcpy(Async)`` copies are ``Default`` (unified addressing decides).
* ``gpu.cuda.memory.copy.duration`` histogram s, by cuda.api, cuda.memcpy.kind,
  cuda.device.index and, for failed calls, error.type: host time in those copy calls.
* ``gpu.cuda.memory.allocations`` counter By, by cuda.api, cuda.device.index: the runtime's ``cudaMalloc*``
  and the driver's ``cuMemAlloc*`` and ``cuMemCreate`` (on the device its ``CUmemAllocationProp`` names); a
  runtime allocation that reaches the driver is counted once, as the runtime call.
* ``gpu.cuda.memory.free.bytes`` counter By (frees of allocations that were seen).
* ``gpu.cuda.memory.outstanding`` updown By: allocated and not yet freed, by device.
* ``gpu.cuda.memory.leaked`` counter By and ``gpu.cuda.memory.leaked.allocations`` counter
  {allocation}: still outstanding when the process exited, by device (also logged).
* ``gpu.cuda.synchronize.duration`` histogram s, by cuda.api, cuda.device.index: host waiting.
* ``gpu.cuda.stream.synchronize.calls``, ``gpu.cuda.device.synchronize.calls``,
  ``gpu.cuda.event.synchronize.calls`` counters {call} (OBI).
* ``gpu.cuda.graph.launch.calls`` counter {call}, by cuda.api, cuda.device.index: CUDA graph replays
  (``torch.compile(mode="reduce-overhead")``, vLLM, SGLang); the kernels inside a replay pass no
  launch probe, so ``gpu.cuda.kernel.launch.calls`` does not count them.
* ``gpu.cuda.api.errors`` counter {call}, by cuda.api, error.type, cuda.device.index.
* ``gpu.cuda.api.calls`` / ``gpu.cuda.api.duration``: memset, event, stream, host-register and stream-capture
  (``cudaStreamBeginCapture*``, ``cudaStreamEndCapture*``) calls, and the driver's ``cuMemMap`` / ``cuMemUnmap``,
  by cuda.api.
* ``gpu.cuda.memory.mapped`` updown By: bytes of physical chunks mapped into virtual ranges (``cuMemMap`` minus
  ``cuMemUnmap``, successful calls), by the calling thread's device: PyTorch's expandable segments map each chunk
  they create, so with ``expandable_segments`` this is the part of ``gpu.cuda.memory.outstanding`` in use.

``cuda.graph.captured`` = true, on any of these metrics (and on spans): work made while its thread had a CUDA stream
capture open (``cudaStreamBeginCapture``..``cudaStreamEndCapture``; a launch also when it goes to the stream a
capture began on, from any thread). It was recorded into a graph, not run: it runs at each replay of the graph
(``gpu.cuda.graph.launch.calls``), which no launch or copy probe sees. Absent on work that ran, so a dashboard
that filters ``cuda.graph.captured != true`` counts what ran. ``gpu.cuda.kernel.grid.size`` and
``gpu.cuda.kernel.block.size`` count launches that ran only.
"""
from __future__ import annotations

from otel_ebpf.core.processing import MetricSpec

__all__ = ["ASYNC_MEMCPY_APIS", "COUNTED", "HANDLE_APIS", "MEMCPY_APIS", "MEMCPY_KINDS", "METRICS", "SYNC_CALLS"]

MEMCPY_KINDS = {0: "HostToHost", 1: "HostToDevice", 2: "DeviceToHost", 3: "DeviceToDevice", 4: "Default"}
# name -> (kind, unit, description)
METRICS: dict[str, MetricSpec] = {
    "gpu.cuda.kernel.launch.calls": ("counter", "{call}", "Kernel launches, by the entry point that made them "
                                     "(cuda.api: cudaLaunchKernel* of the runtime, cuLaunchKernel* of the driver)."),
    "gpu.cuda.kernel.grid.size": ("histogram", "1", "Blocks per launched grid."),
    "gpu.cuda.kernel.block.size": ("histogram", "1", "Threads per block of launched kernels."),
    "gpu.cuda.memory.copies": ("histogram", "By", "Bytes per successful cudaMemcpy* or cuMemcpy* call."),
    "gpu.cuda.memory.copy.duration": ("histogram", "s", "Time the host spent in cudaMemcpy* and cuMemcpy* calls."),
    "gpu.cuda.memory.allocations": ("counter", "By", "Bytes allocated by successful cudaMalloc*, cuMemAlloc* and "
                                    "cuMemCreate calls."),
    "gpu.cuda.memory.free.bytes": ("counter", "By", "Bytes released by cudaFree*, cuMemFree* and cuMemRelease of "
                                   "seen allocations."),
    "gpu.cuda.memory.outstanding": ("updown", "By", "Device memory allocated and not yet freed."),
    "gpu.cuda.memory.leaked": ("counter", "By", "Bytes still allocated when the process exited."),
    "gpu.cuda.memory.leaked.allocations": ("counter", "{allocation}",
                                           "Allocations not freed when the process exited."),
    "gpu.cuda.synchronize.duration": ("histogram", "s", "Time the host waited in cuda*Synchronize."),
    "gpu.cuda.stream.synchronize.calls": ("counter", "{call}", "cudaStreamSynchronize calls."),
    "gpu.cuda.device.synchronize.calls": ("counter", "{call}", "cudaDeviceSynchronize calls."),
    "gpu.cuda.event.synchronize.calls": ("counter", "{call}", "cudaEventSynchronize calls."),
    "gpu.cuda.graph.launch.calls": ("counter", "{call}", "CUDA graph replays (cudaGraphLaunch, cuGraphLaunch)."),
    "gpu.cuda.api.errors": ("counter", "{call}", "CUDA runtime calls that returned an error."),
    "gpu.cuda.api.calls": ("counter", "{call}", "Memset, event record, stream wait-event, stream/event create and "
                           "destroy, host-register and stream-capture calls of the CUDA runtime, and the "
                           "driver's cuMemMap/cuMemUnmap, by cuda.api."),
    "gpu.cuda.api.duration": ("histogram", "s", "Time the host spent in those calls (gpu.cuda.api.calls)."),
    "gpu.cuda.memory.sets": ("histogram", "By", "Bytes per successful cudaMemset/cudaMemsetAsync call."),
    "gpu.cuda.memory.host.registered": ("counter", "By", "Host bytes page-locked by successful cudaHostRegister."),
    "gpu.cuda.memory.mapped": ("updown", "By", "Bytes of physical memory mapped into virtual ranges (cuMemMap "
                               "minus cuMemUnmap)."),
}
# counted-only runtime calls (receivers/cuda: kind "count"), by base name
COUNTED = frozenset(("cudaMemset", "cudaMemsetAsync", "cudaEventRecord", "cudaEventRecordWithFlags",
                      "cudaStreamWaitEvent", "cudaStreamCreate", "cudaStreamCreateWithFlags",
                      "cudaStreamCreateWithPriority", "cudaStreamDestroy", "cudaEventCreate",
                      "cudaEventCreateWithFlags", "cudaEventDestroy", "cudaHostRegister", "cudaHostUnregister",
                      "cudaStreamBeginCapture", "cudaStreamBeginCaptureToGraph", "cudaStreamEndCapture",
                      "cuMemMap", "cuMemUnmap"))
# copies, by base name: the runtime's and the driver's (receivers/cuda: kind "memcpy"); those with a stream argument
MEMCPY_APIS = frozenset(("cudaMemcpy", "cudaMemcpyAsync", "cuMemcpy", "cuMemcpyAsync", "cuMemcpyHtoD_v2",
                         "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
                         "cuMemcpyDtoDAsync_v2"))
ASYNC_MEMCPY_APIS = frozenset(a for a in MEMCPY_APIS if "Async" in a)
SYNC_CALLS = {"cudaStreamSynchronize": "gpu.cuda.stream.synchronize.calls",
               "cudaDeviceSynchronize": "gpu.cuda.device.synchronize.calls",
               "cudaEventSynchronize": "gpu.cuda.event.synchronize.calls"}


# physical allocations of the driver's virtual memory management (PyTorch's expandable segments, vLLM's cumem
# allocator): a CUmemGenericAllocationHandle, not a pointer; outstanding from cuMemCreate to cuMemRelease
HANDLE_APIS = frozenset(("cuMemCreate", "cuMemRelease"))
