"""The NCCL processor: NCCL receiver events -> spans and metrics with cross-rank join ids.

Spans (ids: see :mod:`otel_ebpf.processors.nccl.comms`):

* every collective call: ``nccl<Op>`` (``ncclAllReduce``) with ``nccl.op``, ``nccl.comm.id``,
  ``nccl.rank``, ``nccl.nranks``, ``nccl.seq``, ``nccl.count``, ``nccl.datatype``,
  ``nccl.bytes`` (count x datatype size), ``nccl.redop``, ``nccl.root`` where the op has them,
  ``nccl.device`` when known, ``nccl.stream``, ``thread.id`` and ``nccl.timing =
  "host_enqueue"``: timing is host-side enqueue time (the call into NCCL), NOT GPU execution
  time. Every rank's span of collective ``seq`` of one communicator is in trace
  ``derive_id(comm_id, seq)`` under the parent ``derive_id(comm_id, seq, "collective")``;
  the process that is rank 0 also emits that parent, ``nccl <Op>``, with rank 0's times.
* ncclSend/ncclRecv: ``ncclSend``/``ncclRecv`` with ``nccl.peer``; send #k A->B and recv #k
  at B from A share a trace and link each other.
* groups: ``ncclGroup`` covers the outermost ncclGroupStart..ncclGroupEnd of one thread, with
  ``nccl.group.id`` and ``nccl.group.size``. Its members live in their own collectives'
  traces, so containment is a span link from each member to the group span plus the
  member's ``nccl.group.id`` attribute, not a parent/child relation.
* communicator lifecycle: ``ncclCommInitRank``/``...Config``/``...Scalable``/``ncclCommSplit``
  (all ranks' spans of one communicator share trace ``derive_id(comm_id, "init")``),
  ``ncclCommInitAll``, ``ncclCommDestroy``, ``ncclCommAbort``. The split span also carries
  :data:`~otel_ebpf.core.ids.SPLIT_ATTRIBUTES` (parent id, k, parent rank and size, color, key).

Split children's ``nccl.rank``/``nccl.nranks`` come from every parent rank's split call (:mod:`.splits`): computed
here when this agent saw them all (their calls held meanwhile), else left to the gateway's join, the call's span
then carrying ``nccl.parent.rank``.

A call whose ncclResult_t is neither ncclSuccess nor ncclInProgress (the normal answer of a non-blocking
communicator) gets ERROR status with the result's name and is not joined. Calls that cannot be joined (communicator
unknown, rank unknown, no sequence number) keep their attributes and get random ids, or only the shared trace when
just the rank is missing; each is counted in ``otel_ebpf.nccl.unjoined{reason}``.

``ml.step.*`` (otel_ebpf.host.timeline.StepTracker): on each collective span, the calling thread's off-CPU /
run-queue / on-CPU time and the process's other host figures (IO, faults) over the interval since the end of its
previous collective on that communicator (the compute phase).

``hw.id``: the GPU UUID of ``nccl.device`` (otel_ebpf.host.gpus), on collective, p2p and communicator spans (not on
``ncclGroup`` spans, which may cover several devices, nor on root spans) and on ``nccl.calls`` / ``nccl.bytes`` /
``nccl.enqueue.duration``; with the device unknown only when the process can be on one GPU alone.

Metrics: ``nccl.calls`` and ``nccl.bytes`` {nccl.op, nccl.datatype, nccl.comm.id},
``nccl.enqueue.duration`` (s) {nccl.op, nccl.comm.id}, ``nccl.comm.inits`` /
``nccl.comm.destroys`` {nccl.function}, ``nccl.errors`` {nccl.function, nccl.error}.

Every other event passes on unchanged (ProcessExit also frees that process's communicators).
Single-threaded (the pipeline worker); ``start``/``shutdown`` are idempotent.
"""
from __future__ import annotations

import socket

from otel_ebpf.core.events import AttrValue, ProcessExit, SpanLinkRecord, SpanRecord
from otel_ebpf.core.ids import COLLECTIVE_ROOT_ATTRIBUTES, SPLIT_NOCOLOR, collective_ids, derive_id
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles
from otel_ebpf.host.timeline import StepTracker
from otel_ebpf.receivers.nccl import events as ev_mod
from otel_ebpf.receivers.nccl.events import (
    NcclCollective,
    NcclCommEnd,
    NcclCommInfo,
    NcclCommInit,
    NcclCommInitAll,
    NcclCommSplit,
    NcclGroup,
    NcclP2P,
)

from .comms import Comm, CommTable, group_ids, p2p_ids
from .config import Config
from .splits import Held, SplitBook

__all__ = ["METRICS", "SCOPE", "NcclProcessor"]

SCOPE = "otel_ebpf.nccl"
_OK = (0, 7)  # ncclSuccess, ncclInProgress
# name -> (kind, unit, description); the counters are summed per batch (EventProcessor.sums)
METRICS: dict[str, MetricSpec] = {
    "nccl.calls": ("counter", "{call}", "NCCL collective and send/recv calls."),
    "nccl.bytes": ("counter", "By", "Bytes named by NCCL calls (count x datatype size)."),
    "nccl.comm.inits": ("counter", "{communicator}", "Communicators created."),
    "nccl.comm.destroys": ("counter", "{communicator}", "Communicators destroyed or aborted."),
    "nccl.errors": ("counter", "{call}", "NCCL calls that returned an error."),
    "nccl.enqueue.duration": ("histogram", "s", "Host-side time inside NCCL calls (enqueue, not GPU execution)."),
}
Out = list[object]
_Op = NcclCollective | NcclP2P  # the calls that move data: same attributes, metrics and group links
_CommCall = NcclCommInit | NcclCommInitAll | NcclCommSplit  # the calls that make communicators


class NcclProcessor(EventProcessor[Config]):
    """Consumer turning ``otel_ebpf.receivers.nccl`` events into SpanRecord/MetricRecord."""

    NAME = "nccl"
    SCOPE = SCOPE
    METRICS = METRICS

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(config, ctx, next_)
        self.host = config.host or socket.gethostname()
        self.comms = CommTable(config.max_comms, ctx.telemetry, self.host)
        self._gpus = ctx.gpus  # otel_ebpf.host.gpus.GpuResolver or None
        self._steps = StepTracker(getattr(ctx, "host_stats", None))  # ml.step.* host figures
        self.splits = SplitBook(config.max_comms, config.max_held_calls, int(config.split_wait * 1e9))
        self._now_ns = 0  # the latest event end seen: the held calls' clock
        self._releasing = False  # re-dispatching held calls: never hold them again

    def shutdown(self) -> None:
        """Emits the calls still held (unresolved) to the next stage, then forgets everything."""
        out: Out = []
        self._emit_held(self.splits.drain(), out)
        self.sums.flush(out)
        if out:
            self._next.consume(out)
        self.comms.clear()
        self.splits.clear()
        self.sums.clear()

    def end_batch(self, out: Out) -> None:
        self._emit_held(self.splits.expired(self._now_ns), out)
        super().end_batch(out)

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

    @handles(ProcessExit)
    def _exit(self, ev: ProcessExit, out: Out) -> None:
        """Frees the process's communicators; the exit always passes on."""
        try:
            if ev.source in ("", "nccl"):
                # only after the NCCL receiver's own exit record, which its ring buffer
                # orders after the process's last NCCL calls (another receiver's may not be)
                self._emit_held(self.splits.expired(self._now_ns, ev.pid), out)
                self.comms.forget_process(ev.pid)
                self.splits.forget_process(ev.pid)
                if self._gpus is not None:
                    self._gpus.forget(ev.pid)
        finally:
            out.append(ev)

    # ---- metrics ---------------------------------------------------------------------
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

    # ---- collectives and p2p ---------------------------------------------------------
    def _comm_of(self, ev: _Op) -> Comm | None:
        """The call's communicator; a handle this process never created is the handle of its
        oldest non-blocking split child still without one (see :mod:`.splits`)."""
        comm = self.comms.get(ev.pid, ev.comm)
        if comm is None and ev.comm and (child := self.splits.bind(ev.pid)) is not None:
            comm = child if self.comms.add(ev.pid, ev.comm, child) else None
        return comm

    def _hold(self, ev: _Op, comm: Comm | None) -> bool:
        """True when the call waits for its split communicator's rank (held, emitted later)."""
        self._now_ns = max(self._now_ns, ev.end_ns)
        return (comm is not None and comm.rank is None and not self._releasing
                and self.splits.hold(comm, ev.pid, ev.end_ns, ev))

    def _op_attrs(self, ev: _Op, comm: Comm | None) -> dict[str, AttrValue]:
        attrs: dict[str, AttrValue] = {"nccl.op": ev.op, "nccl.count": ev.count,
                                       "nccl.datatype": ev_mod.datatype_name(ev.datatype),
                                       "nccl.timing": "host_enqueue", "thread.id": ev.tid}
        size = ev_mod.datatype_size(ev.datatype)
        if size is not None:
            attrs["nccl.bytes"] = ev.count * size
        if ev.stream:
            attrs["nccl.stream"] = f"0x{ev.stream:x}"
        if ev.seq is not None:
            attrs["nccl.seq"] = ev.seq
        if ev.group:
            attrs["nccl.group.id"] = format(group_ids(self.host, ev.pid, ev.group)[1], "016x")
        if comm is not None:
            attrs["nccl.comm.id"] = comm.comm_id
            for key, value in (("nccl.rank", comm.rank), ("nccl.nranks", comm.nranks),
                               ("nccl.device", comm.device)):
                if value is not None:
                    attrs[key] = value
            if comm.rank is None and comm.parent_rank is not None:
                attrs["nccl.parent.rank"] = comm.parent_rank  # for the gateway's join (core.ids)
        self._add_hw_id(attrs, ev.pid, comm.device if comm is not None else None)
        return attrs

    def _add_hw_id(self, attrs: dict[str, AttrValue], pid: int, device: int | None) -> None:
        """``hw.id`` of the communicator's CUDA device (unknown device: only when the process can
        be on one GPU alone), through otel_ebpf.host.gpus."""
        uuid = self._gpus.hw_id(pid, -1 if device is None else device) if self._gpus is not None else None
        if uuid:
            attrs["hw.id"] = uuid

    def _op_metrics(self, ev: _Op, attrs: dict[str, AttrValue], out: Out) -> None:
        """nccl.calls / nccl.bytes (summed) and nccl.enqueue.duration of one call."""
        dims: dict[str, AttrValue] = {"nccl.op": ev.op, "nccl.datatype": attrs["nccl.datatype"]}
        for key in ("nccl.comm.id", "hw.id"):
            if key in attrs:
                dims[key] = attrs[key]
        self._count(ev.pid, "nccl.calls", 1, **dims)
        size = ev_mod.datatype_size(ev.datatype)
        if size is not None:
            self._count(ev.pid, "nccl.bytes", ev.count * size, **dims)
        dims = {k: attrs[k] for k in ("nccl.op", "nccl.comm.id", "hw.id") if k in attrs}
        self.metric(out, ev.pid, "nccl.enqueue.duration", max(0, ev.end_ns - ev.start_ns) / 1e9, dims)

    def _group_links(self, ev: _Op) -> tuple[SpanLinkRecord, ...]:
        if not ev.group:
            return ()
        trace, span = group_ids(self.host, ev.pid, ev.group)
        return (SpanLinkRecord(trace, span, {"nccl.link": "group"}),)

    def _joinable(self, ev: _Op, comm: Comm | None, error: str | None) -> tuple[Comm | None, int]:
        """(``comm``, the call's seq) when the call can take join ids (issued, comm known,
        numbered), else (None, 0); counts why it cannot, or that its rank is unknown here."""
        if error is not None:
            return None, 0
        if comm is None or ev.seq is None:
            self._unjoined("unknown_comm" if comm is None else "no_seq")
            return None, 0
        if comm.rank is None:
            self._unjoined("no_rank" if comm.parent_rank is None else "rank_at_gateway")
        return comm, ev.seq

    @handles(NcclCollective)
    def _collective(self, ev: NcclCollective, out: Out) -> None:
        comm = self._comm_of(ev)
        if self._hold(ev, comm):
            return
        attrs = self._op_attrs(ev, comm)
        if ev.redop is not None:
            attrs["nccl.redop"] = ev_mod.redop_name(ev.redop)
        if ev.root is not None:
            attrs["nccl.root"] = ev.root
        attrs.update(self._steps.attributes((ev.pid, ev.comm), ev.pid, ev.tid, ev.start_ns, ev.end_ns))
        error = self._error(ev.pid, "nccl" + ev.op, ev.rc)
        trace = parent = span = None
        joined, seq = self._joinable(ev, comm, error)
        if joined is not None and joined.rank is None:
            # the shared trace, but no parent: who is rank 0 is unknown (the gateway's join can
            # resolve a split child from nccl.parent.rank, and synthesizes the root)
            trace = collective_ids(joined.comm_id, seq, 0)[0]
        elif joined is not None and joined.rank is not None:
            trace, parent, span = collective_ids(joined.comm_id, seq, joined.rank)
            if joined.rank == 0 and self.config.root_spans:
                out.append(self._root_span(ev, attrs, trace, parent))
        out.append(SpanRecord(ev.pid, "nccl" + ev.op, ev.start_ns, ev.end_ns, attrs, SCOPE, trace_id=trace,
                              span_id=span, parent_span_id=parent, error=error,
                              links=self._group_links(ev)))
        self._op_metrics(ev, attrs, out)

    def _root_span(self, ev: NcclCollective, attrs: dict[str, AttrValue], trace: int, span: int) -> SpanRecord:
        root = {k: attrs[k] for k in COLLECTIVE_ROOT_ATTRIBUTES if k in attrs}
        return SpanRecord(ev.pid, f"nccl {ev.op}", ev.start_ns, ev.end_ns, root, SCOPE, trace_id=trace,
                          span_id=span)

    @handles(NcclP2P)
    def _p2p(self, ev: NcclP2P, out: Out) -> None:
        comm = self._comm_of(ev)
        if self._hold(ev, comm):
            return
        attrs = self._op_attrs(ev, comm)
        attrs["nccl.peer"] = ev.peer
        error = self._error(ev.pid, "nccl" + ev.op, ev.rc)
        trace = span = None
        links = self._group_links(ev)
        joined, seq = self._joinable(ev, comm, error)
        if joined is not None and joined.rank is not None:
            send = ev.op == "Send"
            src, dst = (joined.rank, ev.peer) if send else (ev.peer, joined.rank)
            trace, send_span, recv_span = p2p_ids(joined.comm_id, src, dst, seq)
            span, other = (send_span, recv_span) if send else (recv_span, send_span)
            links = (SpanLinkRecord(trace, other, {"nccl.link": "recv" if send else "send"}), *links)
        out.append(SpanRecord(ev.pid, "nccl" + ev.op, ev.start_ns, ev.end_ns, attrs, SCOPE, trace_id=trace,
                              span_id=span, error=error, links=links))
        self._op_metrics(ev, attrs, out)

    @handles(NcclGroup)
    def _group(self, ev: NcclGroup, out: Out) -> None:
        trace, span = group_ids(self.host, ev.pid, ev.group)
        attrs: dict[str, AttrValue] = {"nccl.group.id": format(span, "016x"), "nccl.group.size": ev.members,
                                       "nccl.timing": "host_enqueue", "thread.id": ev.tid}
        out.append(SpanRecord(ev.pid, "ncclGroup", ev.start_ns, ev.end_ns, attrs, SCOPE, trace_id=trace,
                              span_id=span, error=self._error(ev.pid, "ncclGroupEnd", ev.rc)))

    # ---- communicators ---------------------------------------------------------------
    def _comm_span(self, ev: _CommCall, name: str, attrs: dict[str, AttrValue], comm_id: str | None,
                   rank: int | None, error: str | None, out: Out) -> None:
        trace = span = None
        if comm_id is not None:
            attrs["nccl.comm.id"] = comm_id
            trace = derive_id(comm_id, "init")
            if rank is not None:
                span = derive_id(comm_id, "init", rank, bits=64)
        attrs["thread.id"] = ev.tid
        self._add_hw_id(attrs, ev.pid, None)
        out.append(SpanRecord(ev.pid, name, ev.start_ns, ev.end_ns, attrs, SCOPE, trace_id=trace,
                              span_id=span, error=error))

    def _created(self, pid: int, function: str, handle: int, comm: Comm) -> None:
        self.comms.add(pid, handle, comm)
        self._count(pid, "nccl.comm.inits", 1, **{"nccl.function": function})

    @handles(NcclCommInit)
    def _init(self, ev: NcclCommInit, out: Out) -> None:
        error = self._error(ev.pid, ev.function, ev.rc)
        comm_id = None
        if error is None and ev.comm:
            comm_id = self.comms.next_init_id(ev.pid, ev.unique_id)
            self._created(ev.pid, ev.function, ev.comm, Comm(comm_id, ev.rank, ev.nranks))
        attrs: dict[str, AttrValue] = {"nccl.rank": ev.rank, "nccl.nranks": ev.nranks}
        self._comm_span(ev, ev.function, attrs, comm_id, ev.rank, error, out)

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
        self._comm_span(ev, "ncclCommSplit", attrs, child.comm_id if child else None, None, error, out)
        for comm_id in dict.fromkeys(c.comm_id for c in resolved):
            self._emit_held(self.splits.release(comm_id), out, unresolved=False)

    def _new_child(self, ev: NcclCommSplit, child: Comm) -> None:
        """A split child: known by its handle, or (non-blocking: no handle at return, whatever
        the return code, see :mod:`.splits`) waiting for the first call on a new handle."""
        self._count(ev.pid, "nccl.comm.inits", 1, **{"nccl.function": "ncclCommSplit"})
        if ev.comm:
            self.comms.add(ev.pid, ev.comm, child)
        elif not self.splits.expect_handle(ev.pid, child):  # the split succeeded (only caller)
            self.ctx.telemetry.dropped("nccl", "comm_table_full")

    @handles(NcclCommEnd)
    def _end(self, ev: NcclCommEnd, out: Out) -> None:
        function = "ncclCommAbort" if ev.abort else "ncclCommDestroy"
        error = self._error(ev.pid, function, ev.rc)
        comm = self.comms.remove(ev.pid, ev.comm) if error is None else self.comms.get(ev.pid, ev.comm)
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


def create(config: Config, ctx: Context, next_: Consumer) -> NcclProcessor:
    return NcclProcessor(config, ctx, next_)
