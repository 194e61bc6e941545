"""The NCCL processor's communicator side: creation (init, InitAll, split, shrink), end and queries.

:class:`NcclCommunicators` is the base of :class:`~otel_ebpf.processors.nccl.processor.NcclProcessor`: it
owns the communicator table and the split book, the shared helpers (metrics, errors, ``unjoined``
counts, ``hw.id``) and the handlers of the events that make or end communicators. Spans and ids:
see the processor's module doc and :mod:`.comms`.

``ncclCommShrink`` (NCCL >= 2.27, PyTorch's ``shrink_group``): the child's ranks are the parent's minus
the excluded ones in the parent's order, so each survivor computes its own rank and the size; its id is
``derive_id("nccl.shrink", parent id, k, excluded ranks)`` (:meth:`.CommTable.next_shrink`). A shrink
whose excluded list was cut (more than 64 ranks) or whose parent's rank is unknown gives an unranked child.

Single-threaded (the pipeline worker).
"""
from __future__ import annotations

import socket

from otel_ebpf.core.events import AttrValue, SpanRecord
from otel_ebpf.core.ids import SPLIT_NOCOLOR, derive_id
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles
from otel_ebpf.receivers.nccl import events as ev_mod
from otel_ebpf.receivers.nccl.events import (
    NcclCommBind,
    NcclCommEnd,
    NcclCommInfo,
    NcclCommInit,
    NcclCommInitAll,
    NcclCommShrink,
    NcclCommSplit,
)

from .comms import Comm, CommTable
from .config import Config
from .splits import Held, SplitBook

__all__ = ["METRICS", "SCOPE", "NcclCommunicators", "Out"]

SCOPE = "otel_ebpf.nccl"
_OK = (0, 7)  # ncclSuccess, ncclInProgress
# name -> (kind, unit, description); the counters are summed per batch (EventProcessor.sums)
METRICS: dict[str, MetricSpec] = {
    "nccl.calls": ("counter", "{call}", "NCCL collective and send/recv calls (simulated and captured ones not "
                   "counted)."),
    "nccl.captured.calls": ("counter", "{call}", "NCCL collective and send/recv calls made during a CUDA stream "
                            "capture: recorded into a graph, run at each replay, not when called."),
    "nccl.bytes": ("counter", "By", "Bytes named by NCCL calls (count x datatype size)."),
    "nccl.comm.inits": ("counter", "{communicator}", "Communicators created."),
    "nccl.comm.destroys": ("counter", "{communicator}", "Communicators destroyed or aborted."),
    "nccl.errors": ("counter", "{call}", "NCCL calls that returned an error."),
    "nccl.enqueue.duration": ("histogram", "s", "Host-side time inside NCCL calls (enqueue, not GPU execution)."),
    "nccl.gpu.duration": ("histogram", "s", "GPU time of NCCL collectives and send/recv, first kernel channel "
                          "start to last stop (from otel-ebpf's NCCL profiler plugin)."),
}
Out = list[object]
_CommCall = NcclCommInit | NcclCommInitAll | NcclCommSplit | NcclCommShrink  # the calls that make communicators


class NcclCommunicators(EventProcessor[Config]):
    """Communicator state and handlers (module doc); subclassed by the processor, never used alone."""

    NAME = "nccl"
    SCOPE = SCOPE
    METRICS = METRICS

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(config, ctx, next_)
        self.host = config.host or socket.gethostname()
        self.comms = CommTable(config.max_comms, ctx.telemetry, self.host)
        self._gpus = ctx.gpus  # otel_ebpf.host.gpus.GpuResolver or None
        self.splits = SplitBook(config.max_comms, config.max_held_calls, int(config.split_wait * 1e9))
        self._now_ns = 0  # the latest event end seen: the held calls' clock
        self._releasing = False  # re-dispatching held calls: never hold them again

    def _emit_held(self, held: list[Held], out: Out, unresolved: bool = True) -> None:
        """Processes held calls again (rank known now, or to be emitted without it)."""
        self._releasing = True
        try:
            for h in held:
                if unresolved:
                    self._unjoined("split_unresolved")
                self._handlers[type(h.event)](h.event, out)
        finally:
            self._releasing = False

    def _comm_ended(self, pid: int, handle: int) -> None:
        """Hook: the communicator ``handle`` of ``pid`` was destroyed or aborted (its handle may be reused)."""

    def _count(self, pid: int, name: str, value: float, **attrs: AttrValue) -> None:
        self.sums.add(pid, name, float(value), attrs)  # float sums, as before the shared Sums

    def _error(self, pid: int, function: str, rc: int) -> str | None:
        if rc in _OK:
            return None
        name = ev_mod.result_name(rc)
        self._count(pid, "nccl.errors", 1, **{"nccl.function": function, "nccl.error": name})
        return name

    def _unjoined(self, reason: str) -> None:
        self.ctx.telemetry.add("otel_ebpf.nccl.unjoined", 1, reason=reason)

    def _add_hw_id(self, attrs: dict[str, AttrValue], pid: int, device: int | None) -> None:
        """``hw.id`` of the communicator's CUDA device (unknown device: only when the process can
        be on one GPU alone), through otel_ebpf.host.gpus."""
        uuid = self._gpus.hw_id(pid, -1 if device is None else device) if self._gpus is not None else None
        if uuid:
            attrs["hw.id"] = uuid

    def _creator_device(self, pid: int, tid: int) -> int | None:
        """The CUDA device of the thread creating a communicator: NCCL takes the caller's current device
        (NCCL 2.28.9 src/init.cc ncclCommInitRankDev: cudaGetDevice), from the cuda receiver while it runs;
        None without one."""
        threads = self.ctx.cuda_threads
        return threads.device_of(pid, tid) if threads is not None else None

    def _comm_span(self, ev: _CommCall, name: str, attrs: dict[str, AttrValue], comm_id: str | None,
                   rank: int | None, error: str | None, out: Out, device: int | None = None) -> None:
        trace = span = None
        if comm_id is not None:
            attrs["nccl.comm.id"] = comm_id
            trace = derive_id(comm_id, "init")
            if rank is not None:
                span = derive_id(comm_id, "init", rank, bits=64)
        attrs["thread.id"] = ev.tid
        self._add_hw_id(attrs, ev.pid, device)
        out.append(SpanRecord(ev.pid, name, ev.start_ns, ev.end_ns, attrs, SCOPE, trace_id=trace,
                              span_id=span, error=error))

    def _created(self, pid: int, function: str, handle: int, comm: Comm) -> None:
        self.comms.add(pid, handle, comm)
        self._count(pid, "nccl.comm.inits", 1, **{"nccl.function": function})

    @handles(NcclCommInit)
    def _init(self, ev: NcclCommInit, out: Out) -> None:
        error = self._error(ev.pid, ev.function, ev.rc)
        comm_id = None
        device = self._creator_device(ev.pid, ev.tid)
        if error is None and ev.comm:
            comm_id = self.comms.next_init_id(ev.pid, ev.unique_id)
            self._created(ev.pid, ev.function, ev.comm, Comm(comm_id, ev.rank, ev.nranks, device))
        attrs: dict[str, AttrValue] = {"nccl.rank": ev.rank, "nccl.nranks": ev.nranks}
        if device is not None:
            attrs["nccl.device"] = device
        self._comm_span(ev, ev.function, attrs, comm_id, ev.rank, error, out, device)

    @handles(NcclCommInitAll)
    def _init_all(self, ev: NcclCommInitAll, out: Out) -> None:
        error = self._error(ev.pid, "ncclCommInitAll", ev.rc)
        attrs: dict[str, AttrValue] = {"nccl.nranks": ev.ndev, "nccl.devices": tuple(ev.devices)}
        comm_id = None
        if error is None:
            comm_id = self.comms.next_init_all_id(ev.pid)
            for rank, (handle, device) in enumerate(zip(ev.comms, ev.devices, strict=True)):
                if handle:
                    self._created(ev.pid, "ncclCommInitAll", handle, Comm(comm_id, rank, ev.ndev, device))
        self._comm_span(ev, "ncclCommInitAll", attrs, comm_id, None, error, out)

    @handles(NcclCommSplit)
    def _split(self, ev: NcclCommSplit, out: Out) -> None:
        error = self._error(ev.pid, "ncclCommSplit", ev.rc)
        parent = self.comms.get(ev.pid, ev.parent)
        attrs: dict[str, AttrValue] = {"nccl.split.color": ev.color, "nccl.split.key": ev.key}
        child: Comm | None = None
        resolved: list[Comm] = []
        if parent is None:
            self._unjoined("unknown_comm")
        elif error is None:
            k, child_id = self.comms.next_split(parent, ev.color)
            attrs["nccl.split.seq"] = k
            if ev.color != SPLIT_NOCOLOR:
                child = Comm(child_id, None, None, parent.device, parent_rank=parent.rank,
                             split=(parent.comm_id, k))
                self._new_child(ev, child)
            if parent.rank is not None and parent.nranks is not None:
                attrs["nccl.parent.rank"], attrs["nccl.parent.nranks"] = parent.rank, parent.nranks
                resolved = self.splits.record((parent.comm_id, k), parent, ev.color, ev.key, child,
                                              self.comms.holders(parent.comm_id))
        if parent is not None:
            attrs["nccl.parent.comm.id"] = parent.comm_id
        self._comm_span(ev, "ncclCommSplit", attrs, child.comm_id if child else None, None, error, out,
                        parent.device if parent is not None else None)
        for comm_id in dict.fromkeys(c.comm_id for c in resolved):
            self._emit_held(self.splits.release(comm_id), out, unresolved=False)

    def _new_child(self, ev: NcclCommSplit | NcclCommShrink, child: Comm) -> None:
        """A split's or shrink's child: known by its handle, or (non-blocking: no handle at return,
        whatever the return code, see :mod:`.splits`) waiting for the NcclCommBind of its ``newcomm``."""
        function = "ncclCommSplit" if isinstance(ev, NcclCommSplit) else "ncclCommShrink"
        self._count(ev.pid, "nccl.comm.inits", 1, **{"nccl.function": function})
        if ev.comm:
            self.comms.add(ev.pid, ev.comm, child)
        elif not self.splits.expect_handle(ev.pid, ev.newcomm, child):  # the split succeeded (only caller)
            self.ctx.telemetry.dropped("nccl", "comm_table_full")

    @handles(NcclCommBind)
    def _bind(self, ev: NcclCommBind, _out: Out) -> None:
        """The handle of the non-blocking child published at ``ev.newcomm`` (before its first call's event)."""
        child = self.splits.bind(ev.pid, ev.newcomm)
        if child is None:  # its split's record was lost, or the child dropped by a bound (both counted)
            self.ctx.telemetry.dropped("nccl", "bind_without_split")
        else:
            self.comms.add(ev.pid, ev.comm, child)  # False: the table is full (counted there)

    @handles(NcclCommShrink)
    def _shrink(self, ev: NcclCommShrink, out: Out) -> None:
        """The child's ranks are the parent's minus the excluded ones, in the parent's order (NCCL 2.28.9
        src/init.cc ncclCommShrink -> getParentRanks), so every survivor knows its rank and the size."""
        error = self._error(ev.pid, "ncclCommShrink", ev.rc)
        parent = self.comms.get(ev.pid, ev.parent)
        attrs: dict[str, AttrValue] = {"nccl.shrink.excluded": ev.excluded, "nccl.shrink.flags": ev.flags}
        child: Comm | None = None
        if parent is None:
            self._unjoined("unknown_comm")
        elif error is None:
            attrs["nccl.parent.comm.id"] = parent.comm_id
            child = Comm(self.comms.next_shrink(parent, ev.excluded), None, None, parent.device)
            if parent.rank is not None and parent.nranks is not None and len(ev.excluded) == ev.nexcluded:
                child.rank = parent.rank - sum(1 for r in set(ev.excluded) if r < parent.rank)
                child.nranks = parent.nranks - len(set(ev.excluded))
                attrs["nccl.rank"], attrs["nccl.nranks"] = child.rank, child.nranks
            self._new_child(ev, child)
        self._comm_span(ev, "ncclCommShrink", attrs, child.comm_id if child else None,
                        child.rank if child else None, error, out, parent.device if parent is not None else None)

    @handles(NcclCommEnd)
    def _end(self, ev: NcclCommEnd, out: Out) -> None:
        function = "ncclCommAbort" if ev.abort else "ncclCommDestroy"
        error = self._error(ev.pid, function, ev.rc)
        comm = self.comms.end(ev.pid, ev.comm, ev.end_ns) if error is None else self.comms.get(ev.pid, ev.comm)
        if error is None:
            self._comm_ended(ev.pid, ev.comm)
        attrs: dict[str, AttrValue] = {"thread.id": ev.tid}
        if comm is not None:
            attrs["nccl.comm.id"] = comm.comm_id
            if comm.rank is not None:
                attrs["nccl.rank"] = comm.rank
        self._add_hw_id(attrs, ev.pid, comm.device if comm is not None else None)
        if error is None:
            self._count(ev.pid, "nccl.comm.destroys", 1, **{"nccl.function": function})
        out.append(SpanRecord(ev.pid, function, ev.start_ns, ev.end_ns, attrs, SCOPE, error=error))

    @handles(NcclCommInfo)
    def _info(self, ev: NcclCommInfo, _out: Out) -> None:
        comm = self.comms.get(ev.pid, ev.comm)
        if comm is not None and ev.rc == 0 and ev.what in ("rank", "nranks", "device"):
            setattr(comm, ev.what, ev.value)  # the Comm fields are named as NcclCommInfo.what
