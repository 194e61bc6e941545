"""CUDA events (otel_ebpf/receivers/cuda) -> SpanRecord / MetricRecord; everything else passes unchanged.

Spans (scope ``otel_ebpf.cuda``, name = the API symbol, e.g. ``cudaMemcpyAsync``), one per
memcpy (runtime or driver), malloc/free, synchronize, cudaSetDevice and cudaGraphLaunch call; a call with
rc != 0 gets status ERROR described by the CUDA error name. Sampled kernel launches (receiver
``launch_sample_every``) are zero-length spans at the launch.

Span attributes (``cuda.*``; a metric carries only the ones listed with it):

* ``cuda.api``: the symbol called (``cudaMemcpyAsync_ptsz`` for the per-thread-stream twin).
* ``cuda.device.index``: the thread's device from its last successful cudaSetDevice; 0, CUDA's
  default, when it never set one (OBI's name; ``cuda.device`` alone would collide with the namespace).
* ``hw.id``: that device's GPU UUID (``GPU-...``, as dcgm-exporter's ``UUID`` label), on spans
  and on every metric that carries ``cuda.device.index``, when :mod:`otel_ebpf.host.gpus` resolves
  it (NVML present; the process's CUDA_VISIBLE_DEVICES or NVML's process list).
* ``cuda.return_code`` (int) and, when not 0, ``error.type`` (``cudaErrorInsufficientDriver``).
* ``thread.id``: the calling thread (semconv).
* ``cuda.bytes``: bytes copied, allocated, or freed (when the allocation was seen).
* ``cuda.memcpy.kind``: ``HostToHost``, ``HostToDevice``, ``DeviceToHost``, ``DeviceToDevice``,
  ``Default`` (OBI's attribute).
* ``cuda.ptr``: device pointer as hex (``0x7f00...``); ``cuda.mem.handle``: the physical allocation of
  ``cuMemCreate``/``cuMemRelease`` (hex; mapped by the caller with ``cuMemMap``: counted, no span);
  ``cuda.stream``, ``cuda.event``: handles
  as hex; ``cuda.malloc.flags``: cudaMallocManaged flags; ``cuda.device.requested``: the
  argument of cudaSetDevice.
* ``cuda.graph.exec``: the replayed cudaGraphExec_t (hex), on cudaGraphLaunch spans with ``cuda.stream``.
* ``cuda.graph.captured`` = true: the call or launch was made during a CUDA stream capture, so recorded into a
  graph, not run (:mod:`.metrics`); absent otherwise.
* launch spans: ``cuda.kernel.func`` (hex): with CUDA 12 the host stub's address nvcc's ``<<<>>>`` passes;
  with CUDA 13 ``<<<>>>`` calls ``__cudaLaunchKernel`` with a ``cudaKernel_t`` handle (from
  ``__cudaGetKernel``), which libcudart 13 hands on to ``cudaLaunchKernel``, so the value is that handle: one
  per kernel either way, but not an address to symbolize; on a driver launch (``cuLaunchKernel*``) it is the
  ``CUfunction`` handle; ``cuda.kernel.grid`` / ``cuda.kernel.block``
  ([x, y, z]), ``cuda.kernel.shared_mem`` (bytes), ``cuda.kernel.launch_seq``, ``cuda.stream``, and
  ``cuda.kernel.name`` when known (not bounded: spans carry no series).

Metrics (scope ``otel_ebpf.cuda``): :mod:`.metrics`. Every memcpy, synchronize and graph-launch call is counted
in the kernel (receiver ``CallStats``), and
the metrics of those calls (copies, copy and synchronize durations, synchronize and graph-launch calls,
their api.errors) come from those counts, exact even when the receiver's span rate limit gives a call
no span; the spans come from the records. Calls left without a span are counted in
``otel_ebpf.spans.rate_limited{receiver=cuda}``.

Parents. A call made inside a traced Python function or PyTorch operator (the receivers
``python`` / ``torch`` of the same agent write the thread's innermost open call into a map the
cuda program reads at the call's entry: event field ``enclosing``) is a child of that call's
span, in its trace: the ids come from ``otel_ebpf.core.ids.call_ids`` / ``op_ids``,
the functions those processors derive their own span ids with. Otherwise, when the apptrace
receiver runs, the app span current on the thread at the call's start is the parent. The
enclosing function/operator wins over the app span: it is the exact, innermost nesting known
in the kernel, while the app store answers by time and knows nothing of functions/operators
(which are their own traces, not children of app spans). ``gpu.cuda.kernel.launch.calls``
carries ``pytorch.op.name`` when the launches were made inside a probed operator (receiver
``launch_context``, torch receiver running).

Allocations are tracked per process up to ``max_tracked_allocations`` over all processes
(beyond: ``otel_ebpf.events.dropped{receiver=cuda, reason=alloc_table_full}``). A free of a
pointer never seen allocated (e.g. allocated before the probes attached) is counted in
``otel_ebpf.cuda.unknown_frees``, not treated as an error.

Threading: single-threaded (the pipeline worker calls ``consume``); ``consume`` never raises.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from otel_ebpf.core.events import ProcessExit, SpanRecord
from otel_ebpf.core.frozen import maker
from otel_ebpf.core.ids import call_ids, op_ids
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.core.processing import EventProcessor, handles

from ...receivers.cuda.events import (
    AllocCall,
    CallStats,
    EnclosingCall,
    FreeCall,
    GraphLaunchCall,
    KernelLaunch,
    KernelLaunchStats,
    MemcpyCall,
    SetDeviceCall,
    SyncCall,
)
from .config import Config
from .errors import error_name
from .kernels import KernelLabels
from .metrics import ASYNC_MEMCPY_APIS, COUNTED, HANDLE_APIS, MEMCPY_APIS, MEMCPY_KINDS, METRICS, SYNC_CALLS

__all__ = ["MEMCPY_KINDS", "METRICS", "SCOPE", "CudaProcessor"]

log = logging.getLogger(__name__)
SCOPE = "otel_ebpf.cuda"
TELEMETRY_NAME = "cuda"


_new_span = maker(SpanRecord)  # SpanRecord(*values) made in C (otel_ebpf.core.frozen)
_BASES: dict[str, str] = {}  # _base_api's answers: the receiver's symbols, a few dozen (bounded below)


def _base_api(api: str) -> str:
    """cudaMemcpyAsync_ptsz -> cudaMemcpyAsync."""
    base = _BASES.get(api)
    if base is None:
        base = api.removesuffix("_ptsz").removesuffix("_ptds")
        if len(_BASES) < 1024:
            _BASES[api] = base
    return base


def _enclosing_ids(pid: int, tid: int, enc: EnclosingCall) -> tuple[int, int]:
    """(trace id, span id) of the span the python/torch processor makes for ``enc``."""
    ids = op_ids if enc.kind == "torch" else call_ids
    return ids(pid, tid, enc.start_ns, enc.root_ns)


def _dev(device: int) -> dict[str, Any]:
    return {"cuda.device.index": device} if device >= 0 else {}


# the completed calls that get a span each (KernelLaunch: a zero-length span of its own)
_Call = MemcpyCall | AllocCall | FreeCall | SyncCall | SetDeviceCall | GraphLaunchCall


@dataclass(slots=True)
class _Alloc:
    size: int
    device: int
    hw_id: str | None = None  # resolved at allocation: its free/leak lands on the same series


def _held(alloc: _Alloc) -> dict[str, Any]:
    attrs = _dev(alloc.device)
    if alloc.hw_id:
        attrs["hw.id"] = alloc.hw_id
    return attrs


class CudaProcessor(EventProcessor[Config]):
    """Processor ``cuda``. Owns the outstanding-allocation table (bounded)."""

    NAME = TELEMETRY_NAME
    SCOPE = SCOPE
    METRICS = METRICS

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(config, ctx, next_)
        self._gpus = ctx.gpus  # otel_ebpf.host.gpus.GpuResolver or None: hw.id beside cuda.device.index
        self._allocs: dict[int, dict[int, _Alloc]] = {}  # pid -> ptr -> allocation
        self._tracked = 0
        self._kernels = KernelLabels(config.kernel_name_limit)
        # The span attributes _where gives, per (pid, device, captured), for one batch (consume): issue 19's
        # enrichment per batch, not per record; a batch is bounded, and the next one asks the GPU table again.
        self._wheres: dict[tuple[int, int, bool], dict[str, Any]] = {}
        self._fast = True  # memcpy, synchronize and graph-launch spans take _counted_call_span (tests: False)

    def consume(self, events: Sequence[object]) -> None:
        self._wheres.clear()
        try:
            super().consume(events)
        finally:
            self._wheres.clear()

    @property
    def tracked_allocations(self) -> int:
        return self._tracked

    def _where(self, pid: int, device: int, captured: bool = False) -> dict[str, Any]:
        """``cuda.device.index`` and, when the GPU is known, its ``hw.id`` (otel_ebpf.host.gpus);
        ``cuda.graph.captured`` for work recorded during a stream capture."""
        attrs = _dev(device)
        if captured:
            attrs["cuda.graph.captured"] = True
        uuid = self._gpus.hw_id(pid, device) if self._gpus is not None else None
        if uuid:
            attrs["hw.id"] = uuid
        return attrs

    def _call_span(self, ev: _Call, extra: dict[str, Any], out: list[object], count_error: bool = True) -> None:
        """The span of a completed call, and (``count_error``) the error counter when it failed."""
        attrs: dict[str, Any] = {"cuda.api": ev.api, "cuda.return_code": ev.rc, "thread.id": ev.tid}
        where = self._where(ev.pid, ev.device, ev.captured)
        attrs.update(where)
        error = None
        if ev.rc != 0:
            error = attrs["error.type"] = error_name(ev.rc, ev.api)
            if count_error:
                self.metric(out, ev.pid, "gpu.cuda.api.errors", 1, {"cuda.api": ev.api, "error.type": error, **where})
        if self.config.spans:
            attrs.update(extra)
            parent = self._parent(ev.pid, ev.tid, ev.start_ns, ev.enclosing)
            out.append(SpanRecord(ev.pid, ev.api, ev.start_ns, ev.end_ns, attrs, scope=SCOPE, error=error,
                                  trace_id=parent[0] if parent else None,
                                  parent_span_id=parent[1] if parent else None))

    def _counted_call_span(self, ev: _Call, out: list[object], extra: tuple[tuple[str, Any], ...] = ()) -> None:
        """The span of a memcpy, synchronize or graph-launch call (whose metrics and errors come from the kernel's
        counts: :meth:`_call_stats`) with span attributes ``extra`` after the common ones: what
        :meth:`_call_span` makes of it with ``count_error=False``, the call's (pid, device, captured) attributes
        from this batch's :attr:`_wheres`, the record made in C (:func:`otel_ebpf.core.frozen.maker`). The hot
        path: a span per call."""
        key = (ev.pid, ev.device, ev.captured)
        where = self._wheres.get(key)
        if where is None:
            where = self._wheres[key] = self._where(ev.pid, ev.device, ev.captured)
        attrs = {"cuda.api": ev.api, "cuda.return_code": ev.rc, "thread.id": ev.tid, **where}
        error = None
        if ev.rc != 0:
            error = attrs["error.type"] = error_name(ev.rc, ev.api)
        for k, v in extra:
            attrs[k] = v
        parent = None
        if ev.enclosing is not None or self.ctx.app_context is not None:
            parent = self._parent(ev.pid, ev.tid, ev.start_ns, ev.enclosing)
        if parent is None and error is None:
            out.append(_new_span(ev.pid, ev.api, ev.start_ns, ev.end_ns, attrs, SCOPE))
        else:  # SpanRecord's fields in order: ..., scope, kind, trace_id, span_id, parent_span_id, error
            out.append(_new_span(ev.pid, ev.api, ev.start_ns, ev.end_ns, attrs, SCOPE, "internal",
                                 parent[0] if parent else None, None, parent[1] if parent else None, error))

    def _parent(self, pid: int, tid: int, time_ns: int, enc: EnclosingCall | None) -> tuple[int, int] | None:
        """(trace id, parent span id): the enclosing Python/PyTorch call, else the app span."""
        if enc is not None:
            return _enclosing_ids(pid, tid, enc)
        store = self.ctx.app_context  # otel_ebpf/receivers/apptrace: the app span a thread is in
        return store.lookup(pid, tid, time_ns) if store is not None else None

    # ---- handlers --------------------------------------------------------------------
    @handles(MemcpyCall)
    def _memcpy(self, ev: MemcpyCall, out: list[object]) -> None:
        kind = MEMCPY_KINDS.get(ev.kind) or f"cudaMemcpyKind({ev.kind})"
        stream = _base_api(ev.api) in ASYNC_MEMCPY_APIS
        if self._fast and self.config.spans:
            copy = (("cuda.bytes", ev.bytes), ("cuda.memcpy.kind", kind))
            self._counted_call_span(ev, out, (*copy, ("cuda.stream", hex(ev.stream))) if stream else copy)
            return
        extra: dict[str, Any] = {"cuda.bytes": ev.bytes, "cuda.memcpy.kind": kind}
        if stream:
            extra["cuda.stream"] = hex(ev.stream)
        self._call_span(ev, extra, out, count_error=False)  # metrics: _call_stats

    @handles(AllocCall)
    def _alloc(self, ev: AllocCall, out: list[object]) -> None:
        extra: dict[str, Any] = {"cuda.bytes": ev.size}
        base = _base_api(ev.api)
        if ev.rc == 0:
            extra["cuda.mem.handle" if base in HANDLE_APIS else "cuda.ptr"] = hex(ev.ptr)
        if base in ("cudaMallocAsync", "cuMemAllocAsync"):
            extra["cuda.stream"] = hex(ev.stream)
        elif base in ("cudaMallocManaged", "cuMemAllocManaged"):
            extra["cuda.malloc.flags"] = ev.flags
        self._call_span(ev, extra, out)
        if ev.rc != 0:
            return
        self.metric(out, ev.pid, "gpu.cuda.memory.allocations", ev.size,
                     {"cuda.api": ev.api, **self._where(ev.pid, ev.device, ev.captured)})
        self._track(ev, out)

    def _track(self, ev: AllocCall, out: list[object]) -> None:
        table = self._allocs.setdefault(ev.pid, {})
        old = table.pop(ev.ptr, None)
        if old is not None:  # the same pointer again: its free was missed
            self._tracked -= 1
            self.metric(out, ev.pid, "gpu.cuda.memory.outstanding", -old.size, _held(old))
        if self._tracked >= self.config.max_tracked_allocations:
            self._telemetry.dropped(TELEMETRY_NAME, "alloc_table_full")
            if not table:
                del self._allocs[ev.pid]
            return
        where = self._where(ev.pid, ev.device)
        table[ev.ptr] = alloc = _Alloc(ev.size, ev.device, where.get("hw.id"))
        self._tracked += 1
        self.metric(out, ev.pid, "gpu.cuda.memory.outstanding", ev.size, _held(alloc))

    @handles(FreeCall)
    def _free(self, ev: FreeCall, out: list[object]) -> None:
        table = self._allocs.get(ev.pid)
        alloc = table.get(ev.ptr) if table is not None and ev.rc == 0 else None
        base = _base_api(ev.api)
        extra: dict[str, Any] = {"cuda.mem.handle" if base in HANDLE_APIS else "cuda.ptr": hex(ev.ptr)}
        if base in ("cudaFreeAsync", "cuMemFreeAsync"):
            extra["cuda.stream"] = hex(ev.stream)
        if alloc is not None:
            extra["cuda.bytes"] = alloc.size
        self._call_span(ev, extra, out)
        if ev.rc != 0 or ev.ptr == 0:  # cudaFree(NULL) is a no-op
            return
        if alloc is None or table is None:
            self._telemetry.add("otel_ebpf.cuda.unknown_frees", 1, receiver=TELEMETRY_NAME)
            return
        del table[ev.ptr]
        if not table:
            del self._allocs[ev.pid]
        self._tracked -= 1
        self.metric(out, ev.pid, "gpu.cuda.memory.outstanding", -alloc.size, _held(alloc))
        self.metric(out, ev.pid, "gpu.cuda.memory.free.bytes", alloc.size, _held(alloc))

    @handles(SyncCall)
    def _sync(self, ev: SyncCall, out: list[object]) -> None:
        base = _base_api(ev.api)
        handle = {"cudaStreamSynchronize": "cuda.stream", "cudaEventSynchronize": "cuda.event"}.get(base)
        extra = ((handle, hex(ev.handle)),) if handle else ()
        if self._fast and self.config.spans:
            self._counted_call_span(ev, out, extra)
            return
        self._call_span(ev, dict(extra), out, count_error=False)  # metrics: _call_stats

    @handles(GraphLaunchCall)
    def _graph(self, ev: GraphLaunchCall, out: list[object]) -> None:
        extra = (("cuda.graph.exec", hex(ev.exec)), ("cuda.stream", hex(ev.stream)))
        if self._fast and self.config.spans:
            self._counted_call_span(ev, out, extra)
            return
        self._call_span(ev, dict(extra), out, count_error=False)  # metrics: _call_stats

    @handles(CallStats)
    def _call_stats(self, ev: CallStats, out: list[object]) -> None:
        """Metrics of memcpy/synchronize/graph-launch calls, from the kernel's exact counts."""
        if ev.calls <= 0:
            return
        where = self._where(ev.pid, ev.device, ev.captured)
        error = error_name(ev.rc, ev.api) if ev.rc != 0 else None
        if error is not None:
            self.metric(out, ev.pid, "gpu.cuda.api.errors", ev.calls,
                         {"cuda.api": ev.api, "error.type": error, **where})
        if ev.limited > 0:
            self._telemetry.add("otel_ebpf.spans.rate_limited", ev.limited, receiver=TELEMETRY_NAME)
        base = _base_api(ev.api)
        if base in MEMCPY_APIS:
            kind = MEMCPY_KINDS.get(ev.kind, f"cudaMemcpyKind({ev.kind})")
            if error is None:
                self.metric(out, ev.pid, "gpu.cuda.memory.copies", ev.bytes, {"cuda.memcpy.kind": kind, **where},
                             count=ev.calls, buckets=ev.bytes_hist)
            attrs = {"cuda.api": ev.api, "cuda.memcpy.kind": kind, **where}
            if error is not None:
                attrs["error.type"] = error
            self.metric(out, ev.pid, "gpu.cuda.memory.copy.duration", ev.dur_ns / 1e9, attrs,
                         count=ev.calls, buckets=ev.dur_hist)
            return
        if base in COUNTED:
            self._counted(ev, base, error, where, out)
            return
        if base in ("cudaGraphLaunch", "cuGraphLaunch"):
            self.metric(out, ev.pid, "gpu.cuda.graph.launch.calls", ev.calls, {"cuda.api": ev.api, **where})
            return
        self.metric(out, ev.pid, "gpu.cuda.synchronize.duration", ev.dur_ns / 1e9, {"cuda.api": ev.api, **where},
                     count=ev.calls, buckets=ev.dur_hist)
        counter = SYNC_CALLS.get(base)
        if counter is not None:
            self.metric(out, ev.pid, counter, ev.calls, where)

    def _counted(self, ev: CallStats, base: str, error: str | None, where: dict[str, Any], out: list[object]) -> None:
        attrs = {"cuda.api": ev.api, **where}
        self.metric(out, ev.pid, "gpu.cuda.api.calls", ev.calls, attrs)
        self.metric(out, ev.pid, "gpu.cuda.api.duration", ev.dur_ns / 1e9,
                    attrs if error is None else {**attrs, "error.type": error}, count=ev.calls, buckets=ev.dur_hist)
        if error is not None:
            return
        if base in ("cudaMemset", "cudaMemsetAsync"):
            self.metric(out, ev.pid, "gpu.cuda.memory.sets", ev.bytes, where, count=ev.calls, buckets=ev.bytes_hist)
        elif base == "cudaHostRegister":
            self.metric(out, ev.pid, "gpu.cuda.memory.host.registered", ev.bytes, where)
        elif base in ("cuMemMap", "cuMemUnmap") and ev.bytes:
            self.metric(out, ev.pid, "gpu.cuda.memory.mapped", ev.bytes if base == "cuMemMap" else -ev.bytes, where)

    @handles(SetDeviceCall)
    def _set_device(self, ev: SetDeviceCall, out: list[object]) -> None:
        self._call_span(ev, {"cuda.device.requested": ev.requested}, out)

    @handles(KernelLaunch)
    def _launch(self, ev: KernelLaunch, out: list[object]) -> None:
        if not self.config.spans:
            return
        attrs: dict[str, Any] = {
            "cuda.api": ev.api, "thread.id": ev.tid, "cuda.kernel.func": hex(ev.func),
            "cuda.kernel.grid": ev.grid, "cuda.kernel.block": ev.block,
            "cuda.kernel.shared_mem": ev.shared_mem, "cuda.kernel.launch_seq": ev.seq,
            "cuda.stream": hex(ev.stream), **self._where(ev.pid, ev.device, ev.captured)}
        if ev.kernel:
            attrs["cuda.kernel.name"] = ev.kernel
        parent = self._parent(ev.pid, ev.tid, ev.time_ns, ev.enclosing)
        out.append(SpanRecord(ev.pid, ev.api, ev.time_ns, ev.time_ns, attrs, scope=SCOPE,
                              trace_id=parent[0] if parent else None, parent_span_id=parent[1] if parent else None))

    @handles(KernelLaunchStats)
    def _launch_stats(self, ev: KernelLaunchStats, out: list[object]) -> None:
        if ev.count <= 0:
            return
        dev = self._where(ev.pid, ev.device)
        calls = {**dev, "pytorch.op.name": ev.op} if ev.op else dict(dev)
        if ev.captured:
            calls["cuda.graph.captured"] = True
        if ev.api:  # who launched: cudaLaunchKernel* (the runtime) or cuLaunchKernel* (the driver), _ptsz folded
            calls["cuda.api"] = _base_api(ev.api)
        if ev.kernel and self._kernels.limit:
            calls["cuda.kernel.name"] = self._kernels.label(ev.pid, ev.kernel)
        self.metric(out, ev.pid, "gpu.cuda.kernel.launch.calls", ev.count, calls)
        if ev.captured:
            return
        self.metric(out, ev.pid, "gpu.cuda.kernel.grid.size", ev.grid_size, dev, count=ev.count)
        self.metric(out, ev.pid, "gpu.cuda.kernel.block.size", ev.block_size, dev, count=ev.count)

    @handles(ProcessExit)
    def _exit(self, ev: ProcessExit, out: list[object]) -> None:
        """Leak report for the process, then the exit itself (always passed on). Only the CUDA
        receiver's own exit record counts: it is ordered after the process's last CUDA calls."""
        try:
            if ev.source not in ("", "cuda"):
                return
            self._kernels.forget(ev.pid)
            table = self._allocs.pop(ev.pid, None)
            if not table:
                return
            self._tracked -= len(table)
            by_device: dict[tuple[int, str], list[int]] = {}
            for alloc in table.values():
                acc = by_device.setdefault((alloc.device, alloc.hw_id or ""), [0, 0])
                acc[0] += alloc.size
                acc[1] += 1
            for (device, hw_id), (nbytes, count) in sorted(by_device.items()):
                held = _held(_Alloc(0, device, hw_id or None))
                self.metric(out, ev.pid, "gpu.cuda.memory.leaked", nbytes, held)
                self.metric(out, ev.pid, "gpu.cuda.memory.leaked.allocations", count, held)
            log.info("cuda: process %d (%s) exited with %d CUDA allocations (%d bytes) not freed",
                     ev.pid, ev.comm, len(table), sum(a.size for a in table.values()))
        finally:
            if self._gpus is not None and ev.source in ("", "cuda"):
                self._gpus.forget(ev.pid)
            out.append(ev)
