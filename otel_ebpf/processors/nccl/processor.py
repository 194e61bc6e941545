"""The NCCL processor: NCCL receiver events -> spans and metrics with cross-rank join ids.

Spans (ids: see :mod:`otel_ebpf.processors.nccl.comms`):

* every collective call: ``nccl<Op>`` (``ncclAllReduce``) with ``nccl.op``, ``nccl.comm.id``,
  ``nccl.rank``, ``nccl.nranks``, ``nccl.seq``, ``nccl.count``, ``nccl.datatype``,
  ``nccl.bytes`` (count x datatype size), ``nccl.redop``, ``nccl.root`` where the op has them,
  ``nccl.device`` when known (the device of the thread that made the communicator, from the cuda receiver
  when it runs, as NCCL takes the caller's current device at init; a split or shrink child's is its
  parent's; ncclCommCuDevice's answer otherwise), ``nccl.stream``, ``thread.id`` and ``nccl.timing =
  "host_enqueue"``: timing is host-side enqueue time (the call into NCCL), NOT GPU execution
  time. Every rank's span of collective ``seq`` of one communicator is in trace
  ``derive_id(comm_id, seq)`` under the parent ``derive_id(comm_id, seq, "collective")``;
  the process that is rank 0 also emits that parent, ``nccl <Op>``, with rank 0's times.
* ncclSend/ncclRecv: ``ncclSend``/``ncclRecv`` with ``nccl.peer``; send #k A->B and recv #k
  at B from A share a trace and link each other.
* groups: ``ncclGroup`` covers the outermost ncclGroupStart..ncclGroupEnd of one thread, with
  ``nccl.group.id``, ``nccl.group.size`` and ``nccl.group.p2p`` (its send/recv members: the
  gateway's collective_join joins the send/recv of all ranks' groups that exchange them as one
  instance). Its members live in their own collectives' traces, so containment is a span link
  from each member to the group span plus the member's ``nccl.group.id`` attribute, not a parent/child relation.
* simulated groups (closed by ``ncclGroupSimulateEnd``: nothing launched): the calls made inside a group are
  held until its end (:mod:`.groups`); a simulated group's span and its members' spans carry
  ``nccl.simulated = true`` and no join ids, count in no metric and not as ``unjoined``, and the
  sequence numbers they took are given back to the later calls.
* captured calls (made while the calling thread had a CUDA stream capture open; the receivers' ``captured``): recorded
  into a CUDA graph, not run. Their spans (and a captured group's) carry ``nccl.captured = true`` and keep
  ``nccl.seq`` (every rank captures the same calls, so the numbers stay aligned) but get no join ids: the collective
  runs at each ``cudaGraphLaunch``, where no NCCL call shows, so there is no arrival to join. They count in
  ``nccl.captured.calls`` {nccl.op, nccl.comm.id}, not in ``nccl.calls`` / ``nccl.bytes``, nor as ``unjoined``.
* communicator lifecycle (:mod:`.communicators`): ``ncclCommInitRank``/``...Config``/``...Scalable``/
  ``ncclCommSplit`` (all ranks' spans of one communicator share trace ``derive_id(comm_id, "init")``),
  ``ncclCommInitAll``, ``ncclCommShrink``, ``ncclCommDestroy``, ``ncclCommAbort``. The split span also carries
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

from otel_ebpf.core.events import AttrValue, ProcessExit, SpanLinkRecord, SpanRecord
from otel_ebpf.core.ids import COLLECTIVE_ROOT_ATTRIBUTES, collective_ids
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.core.processing import handles
from otel_ebpf.host.timeline import StepTracker
from otel_ebpf.receivers.nccl import events as ev_mod
from otel_ebpf.receivers.nccl.events import (
    NcclCollective,
    NcclGroup,
    NcclP2P,
    NcclProfColl,
    NcclProfComm,
    NcclProfCommEnd,
    NcclProfP2P,
)

from .comms import Comm, group_ids, p2p_ids
from .communicators import METRICS, SCOPE, NcclCommunicators, Out
from .config import Config
from .gpu import GpuBook, HostCall, plausible_gpu_time
from .groups import GroupBook

__all__ = ["METRICS", "SCOPE", "NcclProcessor"]

_Op = NcclCollective | NcclP2P  # the calls that move data: same attributes, metrics and group links


class NcclProcessor(NcclCommunicators):
    """Consumer turning ``otel_ebpf.receivers.nccl`` events into SpanRecord/MetricRecord."""

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(config, ctx, next_)
        self._steps = StepTracker(getattr(ctx, "host_stats", None))  # ml.step.* host figures
        self.groups = GroupBook(config.max_held_calls, int(config.split_wait * 1e9), config.max_comms)
        self._ungrouping = False  # re-dispatching a group's members: never hold them again
        self._simulated = False  # ... of a group closed by ncclGroupSimulateEnd
        self.gpu = GpuBook(config.max_comms, ctx.telemetry)  # the profiler plugin's records (.gpu)

    def shutdown(self) -> None:
        """Emits the calls still held (unresolved) to the next stage, then forgets everything."""
        out: Out = []
        self._ungroup(self.groups.drain(), out)
        self._emit_held(self.splits.drain(), out)
        self.sums.flush(out)
        if out:
            self._next.consume(out)
        self.comms.clear()
        self.splits.clear()
        self.groups.clear()
        self.sums.clear()

    def end_batch(self, out: Out) -> None:
        self._ungroup(self.groups.expired(self._now_ns), out)
        self._emit_held(self.splits.expired(self._now_ns), out)
        super().end_batch(out)

    def _comm_ended(self, pid: int, handle: int) -> None:
        self.groups.forget_comm(pid, handle)

    def _ungroup(self, calls: list[_Op], out: Out, simulated: bool = False) -> None:
        """Processes a group's held calls again (its end seen, or given up on)."""
        self._ungrouping, self._simulated = True, simulated
        try:
            for ev in calls:
                self._handlers[type(ev)](ev, out)
        finally:
            self._ungrouping = self._simulated = False

    @handles(ProcessExit)
    def _exit(self, ev: ProcessExit, out: Out) -> None:
        """Frees the process's communicators; the exit always passes on."""
        try:
            if ev.source in ("", "nccl"):
                # only after the NCCL receiver's own exit record, which its ring buffer
                # orders after the process's last NCCL calls (another receiver's may not be)
                self._ungroup(self.groups.expired(self._now_ns, ev.pid), out)
                self._emit_held(self.splits.expired(self._now_ns, ev.pid), out)
                self.comms.forget_process(ev.pid)
                self.groups.forget_process(ev.pid)
                self.gpu.forget_process(ev.pid)
                self.splits.forget_process(ev.pid)
                if self._gpus is not None:
                    self._gpus.forget(ev.pid)
        finally:
            out.append(ev)

    # ---- collectives and p2p ---------------------------------------------------------
    def _comm_of(self, ev: _Op) -> Comm | None:
        """The call's communicator (a non-blocking child's handle was bound by the NcclCommBind before it;
        one ended while the call was inside NCCL, by ncclCommAbort from another thread, is still its)."""
        return self.comms.for_call(ev.pid, ev.comm, ev.start_ns)

    def _take(self, ev: _Op) -> tuple[_Op, Comm | None] | None:
        """(the call renumbered past simulated calls, its communicator), or None when the call is held:
        until its group's end (:mod:`.groups`) or its split communicator's rank (:mod:`.splits`)."""
        self._now_ns = max(self._now_ns, ev.end_ns)
        if ev.group and not self._ungrouping and not self._releasing:
            if self.groups.hold(ev):
                return None
            self.ctx.telemetry.dropped("nccl", "group_calls_full")
        comm = self._comm_of(ev)
        if (comm is not None and comm.rank is None and not self._releasing and not self._simulated
                and self.splits.hold(comm, ev.pid, ev.end_ns, ev)):
            return None
        return (ev, comm) if self._simulated else (self.groups.renumber(ev), comm)

    def _simulated_call(self, ev: _Op, attrs: dict[str, AttrValue], out: Out) -> None:
        """A call of a simulated group: marked, never joined nor counted as work; its number given back."""
        if not self.groups.simulated(ev):
            self.ctx.telemetry.dropped("nccl", "simulated_counters_full")
        attrs["nccl.simulated"] = True
        attrs.pop("nccl.seq", None)
        out.append(SpanRecord(ev.pid, "nccl" + ev.op, ev.start_ns, ev.end_ns, attrs, SCOPE,
                              links=self._group_links(ev)))

    def _captured_call(self, ev: _Op, attrs: dict[str, AttrValue], out: Out) -> None:
        """A call recorded into a CUDA graph (module doc): marked and counted apart, never joined."""
        attrs["nccl.captured"] = True
        error = self._error(ev.pid, "nccl" + ev.op, ev.rc)
        self._count(ev.pid, "nccl.captured.calls", 1,
                    **{k: attrs[k] for k in ("nccl.op", "nccl.comm.id", "hw.id") if k in attrs})
        out.append(SpanRecord(ev.pid, "nccl" + ev.op, ev.start_ns, ev.end_ns, attrs, SCOPE, error=error,
                              links=self._group_links(ev)))

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
        if (taken := self._take(ev)) is None:
            return
        call, comm = taken
        assert isinstance(call, NcclCollective)
        ev = call
        attrs = self._op_attrs(ev, comm)
        if ev.redop is not None:
            attrs["nccl.redop"] = ev_mod.redop_name(ev.redop)
        if ev.root is not None:
            attrs["nccl.root"] = ev.root
        if self._simulated:
            self._simulated_call(ev, attrs, out)
            return
        if ev.captured:
            self._captured_call(ev, attrs, out)
            return
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
        self._host_done(ev, attrs, trace, span, comm, out)

    def _root_span(self, ev: NcclCollective, attrs: dict[str, AttrValue], trace: int, span: int) -> SpanRecord:
        root = {k: attrs[k] for k in COLLECTIVE_ROOT_ATTRIBUTES if k in attrs}
        return SpanRecord(ev.pid, f"nccl {ev.op}", ev.start_ns, ev.end_ns, root, SCOPE, trace_id=trace,
                          span_id=span)

    @handles(NcclP2P)
    def _p2p(self, ev: NcclP2P, out: Out) -> None:
        if (taken := self._take(ev)) is None:
            return
        call, comm = taken
        assert isinstance(call, NcclP2P)
        ev = call
        attrs = self._op_attrs(ev, comm)
        attrs["nccl.peer"] = ev.peer
        if self._simulated:
            self._simulated_call(ev, attrs, out)
            return
        if ev.captured:
            self._captured_call(ev, attrs, out)
            return
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
        self._host_done(ev, attrs, trace, span, comm, out)

    @handles(NcclGroup)
    def _group(self, ev: NcclGroup, out: Out) -> None:
        self._now_ns = max(self._now_ns, ev.end_ns)
        self._ungroup(self.groups.end(ev.pid, ev.group), out, simulated=ev.simulated)
        trace, span = group_ids(self.host, ev.pid, ev.group)
        attrs: dict[str, AttrValue] = {"nccl.group.id": format(span, "016x"), "nccl.group.size": ev.members,
                                       "nccl.group.p2p": ev.p2p, "nccl.timing": "host_enqueue",
                                       "thread.id": ev.tid}
        if ev.simulated:
            attrs["nccl.simulated"] = True
        if ev.captured:
            attrs["nccl.captured"] = True
        out.append(SpanRecord(ev.pid, "ncclGroup", ev.start_ns, ev.end_ns, attrs, SCOPE, trace_id=trace,
                              span_id=span, error=self._error(ev.pid, "ncclGroupEnd", ev.rc)))

    # ---- GPU time from the profiler plugin (.gpu) ----------------------------------------------------
    @handles(NcclProfComm)
    def _prof_comm(self, ev: NcclProfComm, out: Out) -> None:
        self.gpu.comm(ev)

    @handles(NcclProfCommEnd)
    def _prof_comm_end(self, ev: NcclProfCommEnd, out: Out) -> None:
        self.gpu.comm_end(ev.pid, ev.context)

    @handles(NcclProfColl, NcclProfP2P)
    def _prof_op(self, ev: NcclProfColl | NcclProfP2P, out: Out) -> None:
        if not plausible_gpu_time(ev):  # a stop before its start, or a kernel "running" for days: a bad record
            self.ctx.telemetry.dropped(self.NAME, "bad_gpu_time")
            return
        if not self.comms.probed(ev.pid):  # NCCL linked statically, libnccl not probed: the plugin alone
            self._plugin_span(ev, out)
        elif (call := self.gpu.done(ev)) is not None:
            self._gpu_span(ev.pid, ev, call, out)

    def _host_done(self, ev: _Op, attrs: dict[str, AttrValue], trace: int | None, span: int | None,
                   comm: Comm | None, out: Out) -> None:
        """A host call (made inside a profiler plugin's api event when ``ev.api``): its GPU span now if its GPU
        time came first, else when it comes."""
        if not ev.api:
            return
        call = HostCall("nccl" + ev.op, ev.end_ns, attrs, trace, span, comm.nranks if comm is not None else None)
        found = self.gpu.host(ev.pid, ev.api, call)
        if found is not None:
            self._gpu_span(ev.pid, found, call, out)

    def _gpu_span(self, pid: int, op: NcclProfColl | NcclProfP2P, call: HostCall, out: Out) -> None:
        start, end, attrs, parent = self.gpu.gpu_attributes(op, call)
        trace = call.trace_id
        if isinstance(op, NcclProfP2P):  # the gateway moves send/recv spans into their joined instance's trace
            trace = parent = None
        out.append(SpanRecord(pid, call.name + " gpu", start, end, attrs, SCOPE, trace_id=trace,
                              parent_span_id=parent))
        self._gpu_metric(pid, attrs, end - start, out)

    def _plugin_span(self, op: NcclProfColl | NcclProfP2P, out: Out) -> None:
        """The span of an op of a process whose NCCL the uprobes do not see (gpu.GpuBook.plugin_span): a rank
        span the gateway joins (ids from the plugin's comm id and seq), and rank 0's root span."""
        name, start, end, attrs = self.gpu.plugin_span(op)
        comm_id, seq, rank = attrs.get("nccl.comm.id"), attrs.get("nccl.seq"), attrs.get("nccl.rank")
        trace = parent = span = None
        if isinstance(comm_id, str) and isinstance(seq, int) and isinstance(rank, int):
            trace, parent, span = collective_ids(comm_id, seq, rank)
            if rank == 0 and self.config.root_spans:
                root = {k: attrs[k] for k in COLLECTIVE_ROOT_ATTRIBUTES if k in attrs}
                root["nccl.source"] = "profiler_plugin"  # a root, not a GPU child span (collective_join.gpu)
                out.append(SpanRecord(op.pid, f"nccl {op.func}", start, end, root, SCOPE, trace_id=trace,
                                      span_id=parent))
        out.append(SpanRecord(op.pid, name, start, end, attrs, SCOPE, trace_id=trace, span_id=span,
                              parent_span_id=parent))
        self._gpu_metric(op.pid, attrs, end - start, out)

    def _gpu_metric(self, pid: int, attrs: dict[str, AttrValue], duration_ns: int, out: Out) -> None:
        dims: dict[str, AttrValue] = {k: attrs[k] for k in ("nccl.op", "nccl.comm.id", "nccl.algo", "nccl.proto",
                                                             "hw.id") if k in attrs}
        self.metric(out, pid, "nccl.gpu.duration", duration_ns / 1e9, dims)


def create(config: Config, ctx: Context, next_: Consumer) -> NcclProcessor:
    return NcclProcessor(config, ctx, next_)
