"""GPU-side time of NCCL calls, from otel-ebpf's NCCL profiler plugin (receivers/nccl/profiler.py).

The plugin's records tie to the application's call by the CollApi/P2pApi handle NCCL starts inside it: the
call's uprobe record carries it (``api``), and so does the plugin's coll/p2p record (its parent). One
collective or p2p is then:

* the host call's span (``ncclAllReduce``, host enqueue time: as without the plugin, emitted at once), and
* its GPU span, ``ncclAllReduce gpu``, a child of the host span in the same trace, from the first kernel
  channel's start to the last one's stop, with ``nccl.timing = "gpu"``, ``nccl.gpu.duration_ns``,
  ``nccl.algo``, ``nccl.proto``, ``nccl.nchannels``, ``nccl.busbw`` (bytes/s) and ``nccl.algbw``, NCCL's
  ``nccl.gpu.seq`` (its per-function number) and ``nccl.comm.hash`` (its commHash, the id NCCL's own logs,
  RAS and Inspector use), ``nccl.gpu.queue_ns`` (GPU start - the host call's end: how long the work waited on
  its stream; negative when it started inside the call), plus the host span's identity attributes.

A send's or recv's GPU span is a trace of its own (the same attributes, no parent): the gateway moves every
send/recv span into the trace of its joined p2p instance, where a child left in the pair's trace would dangle.

Why a child span and not attributes on the host span: the GPU time is known only when the kernel ends. Holding
the host span until then would hide every rank that entered a hung collective from the gateway's desync
report (their spans would never leave), so the host span goes at once and the GPU span follows.

GPU clock: NCCL's pTimer is the GPU's %globaltimer (ns). The driver keeps it on the host's realtime clock,
so :func:`gpu_epoch_ns` takes it as Unix epoch ns; when a span's GPU start is more than
``MAX_CLOCK_SKEW_NS`` away from its host call, the clock is taken as not synced: the GPU span then starts at
the host call's end, keeps the measured duration and says ``nccl.gpu.clock = "unsynced"``.

Bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = S / t with S the operation's total size
(AllGather, ReduceScatter, AlltoAll: count x datatype x nranks; the rest: count x datatype), busbw = algbw x
2(n-1)/n for AllReduce, (n-1)/n for AllGather, ReduceScatter and AlltoAll, 1 otherwise.

Bounded: every table holds ``max_entries`` (least recently used out, counted as
``otel_ebpf.events.dropped{receiver=nccl, reason=gpu_table_full}``; GPU results no host call claimed, e.g. of
calls made before the uprobes attached, as ``otel_ebpf.nccl.gpu.unmatched``). Single-threaded (the processor's).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from otel_ebpf.core.events import AttrValue
from otel_ebpf.core.ids import collective_ids
from otel_ebpf.receivers.nccl.events import DATATYPES, NcclProfColl, NcclProfComm, NcclProfP2P

__all__ = ["MAX_CLOCK_SKEW_NS", "MAX_GPU_DURATION_NS", "GpuBook", "HostCall", "Op", "bus_factor", "gpu_epoch_ns",
           "plausible_gpu_time", "plugin_datatype"]

MAX_CLOCK_SKEW_NS = 60_000_000_000  # a GPU start a minute away from its host call: the clocks are not synced
MAX_GPU_DURATION_NS = 86_400 * 10**9  # a kernel longer than a day: the record is bad (its end would not be a time)
Op = NcclProfColl | NcclProfP2P
K = TypeVar("K")
V = TypeVar("V")


def gpu_epoch_ns(ptimer: int, host_ns: int) -> int | None:
    """``ptimer`` (GPU %globaltimer ns) as epoch ns, or None when it cannot be (see the module doc)."""
    return ptimer if abs(ptimer - host_ns) <= MAX_CLOCK_SKEW_NS else None


def plausible_gpu_time(op: NcclProfColl | NcclProfP2P) -> bool:
    """Whether ``op``'s kernel time can be a span: a start, a stop not before it, at most a day apart."""
    return op.gpu_start > 0 and 0 <= op.gpu_stop - op.gpu_start <= MAX_GPU_DURATION_NS


def bus_factor(op: str, nranks: int) -> tuple[int, float]:
    """(size multiplier over count x datatype, busbw factor over algbw) of ``op`` on ``nranks`` ranks."""
    n = max(1, nranks)
    if op == "AllReduce":
        return 1, 2 * (n - 1) / n
    if op in ("AllGather", "ReduceScatter", "AlltoAll"):
        return n, (n - 1) / n
    return 1, 1.0


@dataclass(frozen=True, slots=True)
class HostCall:
    """What the GPU span needs from its host call: span name, identity attributes, parent ids."""

    name: str
    end_ns: int
    attributes: dict[str, AttrValue]
    trace_id: int | None
    span_id: int | None
    nranks: int | None


class _Lru(Generic[K, V]):
    def __init__(self, limit: int, on_evict: Any) -> None:
        self.items: OrderedDict[K, V] = OrderedDict()
        self._limit, self._on_evict = limit, on_evict

    def put(self, key: K, value: V) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self._limit:
            self.items.popitem(last=False)
            self._on_evict()

    def pop(self, key: K) -> V | None:
        return self.items.pop(key, None)

    def forget(self, pid: int) -> None:
        for key in [k for k in self.items if k[0] == pid]:  # type: ignore[index]
            del self.items[key]


_IDENTITY = ("nccl.op", "nccl.comm.id", "nccl.rank", "nccl.nranks", "nccl.seq", "nccl.count", "nccl.datatype",
             "nccl.bytes", "nccl.peer", "nccl.root", "nccl.device", "hw.id", "nccl.stream", "nccl.group.id")


class GpuBook:
    """Plugin records per process, matched to host calls by their api handle."""

    def __init__(self, max_entries: int, telemetry: Any) -> None:
        def full() -> None:
            telemetry.dropped("nccl", "gpu_table_full")

        self.comms: _Lru[tuple[int, int], NcclProfComm] = _Lru(max_entries, full)
        self.hosts: _Lru[tuple[int, int], HostCall] = _Lru(max_entries, full)  # by (pid, api)
        # GPU results whose host call has not come (yet): a call the uprobes did not see ends here, pushed out
        # by newer ones, counted as otel_ebpf.nccl.gpu.unmatched (not a loss of ours)
        self.ready: _Lru[tuple[int, int], Op] = _Lru(
            max_entries, lambda: telemetry.add("otel_ebpf.nccl.gpu.unmatched", 1))

    def comm(self, ev: NcclProfComm) -> None:
        self.comms.put((ev.pid, ev.context), ev)

    def comm_end(self, pid: int, context: int) -> None:
        self.comms.pop((pid, context))

    def host(self, pid: int, api: int, call: HostCall) -> Op | None:
        """A host call made inside the plugin's api event ``api``: its op if the op's GPU time came first, else
        remembered for :meth:`done`."""
        found = self.ready.pop((pid, api))
        if found is None:
            self.hosts.put((pid, api), call)
        return found

    def done(self, op: Op) -> HostCall | None:
        """An op whose kernel channels all stopped, of a process whose NCCL calls the uprobes see: its host call
        if it came; if it has not, the op is kept for :meth:`host`."""
        call = self.hosts.pop((op.pid, op.api)) if op.api else None
        if call is None and op.api:
            self.ready.put((op.pid, op.api), op)
        return call

    def forget_process(self, pid: int) -> None:
        for table in (self.comms, self.hosts, self.ready):
            table.forget(pid)

    def gpu_attributes(self, op: Op, call: HostCall) -> tuple[int, int, dict[str, AttrValue], int | None]:
        """(start epoch ns, end epoch ns, attributes, parent span id) of the GPU span of ``op``. A split child's
        call the agent could not rank (its rank is left to the gateway) takes NCCL's rank and size from the
        plugin, and its parent is the id the gateway gives the host span once ranked (core.ids.collective_ids)."""
        attrs: dict[str, AttrValue] = {k: v for k, v in call.attributes.items() if k in _IDENTITY}
        comm = self.comms.items.get((op.pid, op.context))
        parent = call.span_id
        if "nccl.rank" not in attrs and comm is not None:
            attrs["nccl.rank"], attrs["nccl.nranks"] = comm.rank, comm.nranks
            comm_id, seq = attrs.get("nccl.comm.id"), attrs.get("nccl.seq")
            if parent is None and isinstance(op, NcclProfColl) and isinstance(comm_id, str) and isinstance(seq, int):
                parent = collective_ids(comm_id, seq, comm.rank)[2]
        start, end = self._gpu_time(op, call.end_ns, attrs)
        if "nccl.gpu.clock" not in attrs:  # how long the work waited on its stream after the call (< 0: inside it)
            attrs["nccl.gpu.queue_ns"] = start - call.end_ns
        nranks = comm.nranks if comm is not None else call.nranks
        _plan_attributes(op, comm, attrs)
        _bandwidth(str(call.attributes.get("nccl.op", "")), call.attributes.get("nccl.bytes"), nranks, end - start,
                   attrs)
        return start, end, attrs, parent

    def plugin_span(self, op: Op) -> tuple[str, int, int, dict[str, AttrValue]]:
        """(name, start, end, attributes) of the span of an op whose process's NCCL calls are not probed: the
        plugin's identity of it (comm hash, rank, size, NCCL's seq) and its GPU time, ``nccl.source =
        "profiler_plugin"``. NCCL numbers collectives per function, so its ``nccl.comm.id`` is the comm hash and
        the function (``0123456789abcdef/AllReduce``): the same on every rank, joined by the gateway like any."""
        comm = self.comms.items.get((op.pid, op.context))
        attrs: dict[str, AttrValue] = {"nccl.op": op.func, "nccl.source": "profiler_plugin",
                                       "nccl.count": op.count, "thread.id": op.tid}
        attrs["nccl.datatype"], size = plugin_datatype(op.datatype)
        if size is not None:
            attrs["nccl.bytes"] = op.count * size
        if isinstance(op, NcclProfP2P):
            attrs["nccl.peer"] = op.peer
        if comm is not None:
            attrs["nccl.rank"], attrs["nccl.nranks"] = comm.rank, comm.nranks
            if isinstance(op, NcclProfColl):
                attrs["nccl.comm.id"], attrs["nccl.seq"] = f"{comm.comm_hash:016x}/{op.func}", op.seq
        start, end = self._gpu_time(op, op.time_ns, attrs)
        _plan_attributes(op, comm, attrs)
        _bandwidth(op.func, attrs.get("nccl.bytes"), comm.nranks if comm is not None else None, end - start, attrs)
        return "nccl" + op.func, start, end, attrs

    @staticmethod
    def _gpu_time(op: Op, host_ns: int, attrs: dict[str, AttrValue]) -> tuple[int, int]:
        duration = max(0, op.gpu_stop - op.gpu_start)
        start = gpu_epoch_ns(op.gpu_start, host_ns)
        attrs["nccl.timing"] = "gpu"
        if start is None:
            attrs["nccl.gpu.clock"] = "unsynced"
            start = host_ns
        attrs["nccl.gpu.duration_ns"] = duration
        return start, start + duration


_SIZES = dict(DATATYPES.values())  # our datatype names (as the uprobes' spans have them) -> bytes


def plugin_datatype(name: str) -> tuple[str, int | None]:
    """NCCL's datatype name as its profiler gives it (ncclDatatypeToString, src/collectives.cc 2.28.9:
    "ncclFloat32", "ncclBfloat16") -> (our name, "float32", and its size in bytes, None if unknown)."""
    ours = name.removeprefix("nccl").lower()
    return ours, _SIZES.get(ours)


def _plan_attributes(op: Op, comm: NcclProfComm | None, attrs: dict[str, AttrValue]) -> None:
    attrs["nccl.nchannels"] = op.nchannels
    attrs["nccl.gpu.channels"] = op.channels
    if comm is not None:
        attrs["nccl.comm.hash"] = format(comm.comm_hash, "016x")
    if isinstance(op, NcclProfColl):
        attrs["nccl.algo"], attrs["nccl.proto"], attrs["nccl.gpu.seq"] = op.algo, op.proto, op.seq


def _bandwidth(op: str, nbytes: Any, nranks: int | None, duration: int, attrs: dict[str, AttrValue]) -> None:
    """nccl.algbw / nccl.busbw (bytes/s) of ``nbytes`` (count x datatype size) moved in ``duration`` ns."""
    if duration > 0 and isinstance(nbytes, int) and nranks:
        mult, factor = bus_factor(op, nranks)
        algbw = nbytes * mult / (duration / 1e9)
        attrs["nccl.algbw"] = algbw
        attrs["nccl.busbw"] = algbw * factor
