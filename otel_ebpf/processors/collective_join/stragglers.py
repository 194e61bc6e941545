"""Persistent stragglers: the rank that is last to arrive in most recent collectives of a communicator.

The join calls :meth:`PersistentStragglers.observe` for each COMPLETE collective it releases with at least 2
ranks (partial and evicted collectives and grouped send/recv never come here). Each counts for its last rank
when that rank started at least ``min_lead`` after the next-to-last one (its *lead*: how long the job waited for
it alone), else for nobody: with 2 ranks someone is always last by nanoseconds, and clock offsets between nodes
are of that order too. Per communicator a :class:`~.straggler_window.Window` keeps the latest collectives, finds
the job's steps in them (a late host shifts all its calls until its next synchronisation, so the collectives of
one step are one draw of noise, not many) and decides, as a test over steps with a bounded false-alarm
probability, when a rank is last in too many of them to be chance (that module's doc).

A rank so decided is *raised* once (with ``nccl.straggler.decided_by``: draws, strong or window, ``.steps`` and
``.p``); it is *cleared* once its share over as many of the latest steps (the whole window, if decided by the
window rule) falls below ``clear_ratio`` (hysteresis), when the communicator has had no complete collective for
``idle_timeout`` (reason ``idle``) or when it is pushed out by ``max_comms`` (reason ``evicted``, counted in
``nccl.straggler.comms.evicted``). Both go out as one :class:`~otel_ebpf.core.events.LogRecord` (gateway
resource, event name ``otel_ebpf.nccl.straggler``, ``nccl.straggler.state`` raised (WARN) / cleared (INFO)) tied
to the root span of the collective that decided it, the gauge ``nccl.straggler.persistent`` (1 / 0) and a warning
or info log line (at most one per ``_LOG_EVERY`` seconds; the rest are counted in the next). A raise also puts a
``nccl.straggler.persistent`` event on that collective's root span. A rank slow on the GPU with its host on time
is raised the same way with ``nccl.straggler.kind = gpu`` (:meth:`PersistentStragglers.observe_gpu`).

Single-threaded (the join's). Memory: at most ``max_comms`` x ``max_window`` entries, each with the straggler's
"why late" figures of that collective (the dict the join put on its root span, shared, not copied).
"""
from __future__ import annotations

import logging
import statistics
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_ebpf.core.events import AttrValue, LogRecord, SpanEventRecord
from otel_ebpf.core.ids import collective_root_span_id
from otel_ebpf.core.processing import MetricSpec, metric_record
from otel_ebpf.core.readable import ReadableSpan, span_attributes

from .config import StragglerConfig
from .straggler_window import CLEAR_STEPS, Decision, Entry, Window

__all__ = ["EVENT_NAME", "PersistentStragglers"]

log = logging.getLogger(__name__)
EVENT_NAME = "otel_ebpf.nccl.straggler"
_LOG_EVERY = 10.0  # seconds between two log lines (all communicators together)
_RESOURCE_KEYS = ("host.name", "k8s.pod.name", "k8s.namespace.name", "process.pid")
_SPAN_KEYS = ("hw.id", "nccl.device")
_WHY = ("nccl.straggler.", "nccl.peers_median.")
Out = list[object]


@dataclass(slots=True)
class _Comm:
    window: Window = field(default_factory=Window)
    raised: dict[int, dict[str, AttrValue]] = field(default_factory=dict)  # rank -> its identity at the raise
    steps: dict[int, int] = field(default_factory=dict)  # raised rank -> the steps its raise was decided over
    gpu_steps: dict[int, int] = field(default_factory=dict)  # the same for ranks raised as slow on the GPU
    since: dict[int, int] = field(default_factory=dict)  # raised rank -> the deciding collective's start (ns)
    gpu_since: dict[int, int] = field(default_factory=dict)
    gpu_raised: dict[int, dict[str, AttrValue]] = field(default_factory=dict)  # raised as slow on the GPU
    seen: float = 0.0  # monotonic time of the last complete collective


@dataclass(frozen=True, slots=True)
class _Decided:
    """The collective that decided a raise or clear: the log record is tied to its root span."""

    comm: str
    seq: int
    trace_id: int
    time_ns: int


class PersistentStragglers:
    """See the module doc. ``metrics``/``scope``: the join's table and scope (``nccl.straggler.persistent``);
    ``wall_ns``: epoch ns for the records; ``evicted``: called once per communicator pushed out by max_comms."""

    def __init__(self, config: StragglerConfig, metrics: Mapping[str, MetricSpec], scope: str,
                 wall_ns: Callable[[], int], evicted: Callable[[], None]) -> None:
        self.config = config
        self._metrics, self._scope, self._wall_ns, self._evicted = metrics, scope, wall_ns, evicted
        self._comms: OrderedDict[str, _Comm] = OrderedDict()
        self._logged = float("-inf")  # monotonic time of the last log line
        self._unlogged = 0

    def __len__(self) -> int:
        return len(self._comms)

    def raised(self) -> dict[str, list[int]]:
        """comm id -> the ranks raised on it now."""
        return {c: sorted(s.raised) for c, s in self._comms.items() if s.raised}

    def observe(self, key: tuple[str, int], trace_id: int, ranks: Mapping[int, ReadableSpan],
                figures: Mapping[str, Any], now: float, out: Out, starts: Mapping[int, int]) -> SpanEventRecord | None:
        """One complete collective ``key`` = (comm id, seq) with >= 2 ``ranks`` (rank -> its span) and ``starts``
        (rank -> its start, epoch ns); ``figures``: the straggler's "why late" attributes the join put on the root.
        Appends the records of a raise or clear to ``out``; returns the span event for the root span on a raise."""
        cfg = self.config
        if not cfg.enabled or len(ranks) < 2:
            return None
        comm = self._comm(key[0], now, out)
        comm.seen = now
        win = comm.window
        entry = _entry(ranks, starts, figures, int(cfg.min_lead * 1e9))
        entry.seq = key[1]
        if win.push(entry, len(ranks), cfg):
            win.trim(cfg)
        decided = _Decided(key[0], key[1], trace_id, self._wall_ns())
        event = None
        rank = entry.rank
        if rank is not None and rank not in comm.raised and (decision := win.decide(rank, cfg)) is not None:
            comm.raised[rank] = _identity(ranks[rank])
            comm.steps[rank] = decision.steps
            comm.since[rank] = entry.start_ns
            record = self._record(comm, rank, "raised", decided, now, out, decision=decision)
            event = SpanEventRecord("nccl.straggler.persistent", decided.time_ns, {
                k: record.attributes[k] for k in ("nccl.rank", "nccl.straggler.share", "nccl.straggler.window")})
        if (comm.raised or comm.gpu_raised) and win.clear_due():
            for r in [r for r in comm.raised if win.settled(comm.since.get(r, 0))
                      and win.share(r, comm.steps.get(r, 0)) < cfg.clear_ratio]:
                comm.raised[r] = {**comm.raised[r], **_identity(ranks[r])}
                self._clear(comm, r, "recovered", decided, now, out)
            self._gpu_clears(comm, decided, now, out)
        return event

    def observe_gpu(self, comm_id: str, seq: int, attrs: Mapping[str, Any], late_span: ReadableSpan | None,
                    now: float, out: Out) -> None:
        """The GPU side of collective (``comm_id``, ``seq``) (GpuJoin's joined attributes: nccl.gpu.late.rank,
        .cause, nccl.gpu.skew_ns; ``late_span``: that rank's GPU span) for the window entry of its host side.
        A rank whose kernel started last by ``min_lead``, its stream still busy (cause gpu_queue), in ``ratio``
        of the window's GPU-timed collectives is raised as slow on the GPU (``nccl.straggler.kind = gpu``): its
        host calls came on time, so the arrival count above does not name it."""
        comm = self._comms.get(comm_id)
        entry = comm.window.by_seq.get(seq) if comm is not None and self.config.enabled else None
        if comm is None or entry is None or entry.gpu_timed or attrs.get("nccl.partial"):
            return  # not in a window (a partial one, one evicted, or its host side not complete yet)
        late, lead = attrs.get("nccl.gpu.late.rank"), attrs.get("nccl.gpu.skew_ns")
        if type(late) is not int or type(lead) is not int:
            return
        win, cfg = comm.window, self.config
        win.gpu_time(entry, late if lead >= int(cfg.min_lead * 1e9) else None,
                     str(attrs.get("nccl.gpu.late.cause", "")), lead)
        decided = _Decided(comm_id, seq, late_span.context.trace_id if late_span is not None else 0,
                           self._wall_ns())
        rank = entry.gpu_rank
        if rank is not None and rank not in comm.gpu_raised and late_span is not None \
                and (decision := win.decide_gpu(rank, cfg)) is not None:
            comm.gpu_raised[rank] = _identity(late_span)
            comm.gpu_steps[rank] = decision.steps
            comm.gpu_since[rank] = entry.start_ns
            self._record(comm, rank, "raised", decided, now, out, kind="gpu", decision=decision)
        if comm.gpu_raised and win.clear_due():
            self._gpu_clears(comm, decided, now, out)

    def _gpu_clears(self, comm: _Comm, decided: _Decided, now: float, out: Out) -> None:
        win = comm.window
        for rank in [r for r in comm.gpu_raised if win.settled(comm.gpu_since.get(r, 0))
                     and win.gpu_share(r, comm.gpu_steps.get(r, 0)) < self.config.clear_ratio]:
            self._clear(comm, rank, "recovered", decided, now, out, kind="gpu")

    def expire(self, now: float, out: Out) -> None:
        """Forget communicators idle for ``idle_timeout`` (least recently active first), clearing their ranks."""
        while self._comms:
            name, comm = next(iter(self._comms.items()))
            if now - comm.seen < self.config.idle_timeout:
                return
            self._forget(name, "idle", now, out)

    def clear(self) -> None:
        self._comms.clear()

    # ---- state -----------------------------------------------------------------------
    def _comm(self, name: str, now: float, out: Out) -> _Comm:
        comm = self._comms.get(name)
        if comm is not None:
            self._comms.move_to_end(name)
            return comm
        while len(self._comms) >= self.config.max_comms:
            self._evicted()
            self._forget(next(iter(self._comms)), "evicted", now, out)
        comm = self._comms[name] = _Comm(seen=now)
        return comm

    def _forget(self, name: str, reason: str, now: float, out: Out) -> None:
        comm = self._comms.pop(name)
        decided = _Decided(name, -1, 0, self._wall_ns())
        for rank in list(comm.raised):
            self._clear(comm, rank, reason, decided, now, out)
        for rank in list(comm.gpu_raised):
            self._clear(comm, rank, reason, decided, now, out, kind="gpu")

    def _clear(self, comm: _Comm, rank: int, reason: str, decided: _Decided, now: float, out: Out,
               kind: str = "host") -> None:
        self._record(comm, rank, "cleared", decided, now, out, reason, kind)
        del (comm.gpu_raised if kind == "gpu" else comm.raised)[rank]
        (comm.gpu_steps if kind == "gpu" else comm.steps).pop(rank, None)
        (comm.gpu_since if kind == "gpu" else comm.since).pop(rank, None)

    # ---- records ---------------------------------------------------------------------
    def _record(self, comm: _Comm, rank: int, state: str, decided: _Decided, now: float, out: Out,
                reason: str = "", kind: str = "host", decision: Decision | None = None) -> LogRecord:
        """The log record, the gauge and the log line of a raise or clear of ``rank`` (``kind``: host, late
        to arrive; gpu, slow on the GPU)."""
        win = comm.window
        steps = (comm.gpu_steps if kind == "gpu" else comm.steps).get(rank, 0)
        latest = decision.collectives if decision is not None else win.latest(max(steps, CLEAR_STEPS) if steps else 0)
        attrs = _summary(win, rank, latest) if kind == "host" else {}
        attrs.update(_gpu_summary(win, rank, latest))
        if decision is not None:
            attrs.update({"nccl.straggler.decided_by": decision.by, "nccl.straggler.p": decision.p})
            if decision.steps:
                attrs["nccl.straggler.steps"] = decision.steps
        if win.step_ns():
            attrs["nccl.straggler.step_ns"] = win.step_ns()
        identity = (comm.gpu_raised if kind == "gpu" else comm.raised)[rank]
        attrs.update({"nccl.comm.id": decided.comm, "nccl.rank": rank, **identity, "nccl.straggler.state": state,
                      "nccl.straggler.kind": kind})
        if decided.seq >= 0:
            attrs["nccl.seq"] = decided.seq
        if reason:
            attrs["nccl.straggler.cleared.reason"] = reason
        body = _body(attrs)
        record = LogRecord(None, decided.time_ns, EVENT_NAME, body, attrs, severity="WARN" if state == "raised"
                           else "INFO", scope=self._scope, trace_id=decided.trace_id,
                           span_id=collective_root_span_id(decided.comm, decided.seq) if decided.trace_id else 0)
        out.append(record)
        dims: dict[str, AttrValue] = {"nccl.comm.id": decided.comm, "nccl.rank": rank,
                                      "host.name": str(attrs.get("host.name", "")), "nccl.straggler.kind": kind}
        out.append(metric_record(self._metrics, self._scope, None, "nccl.straggler.persistent",
                                 1 if state == "raised" else 0, dims))
        self._log(state, body, now)
        return record

    def _log(self, state: str, body: str, now: float) -> None:
        if now - self._logged < _LOG_EVERY:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more straggler changes not logged)" if self._unlogged else ""
        self._logged, self._unlogged = now, 0
        log.log(logging.WARNING if state == "raised" else logging.INFO, "NCCL %s%s", body, more)


def _entry(ranks: Mapping[int, ReadableSpan], starts: Mapping[int, int], figures: Mapping[str, Any],
           min_lead_ns: int) -> Entry:
    """The collective (>= 2 ``ranks``, their ``starts``), its last rank (None when it led the next-to-last by less
    than ``min_lead_ns``) and each rank's start relative to the median one (by rank)."""
    by_rank = [starts[rank] for rank in sorted(starts)]
    ordered = sorted(by_rank)
    last, second, first = ordered[-1], ordered[-2], ordered[0]
    last_rank = max(rank for rank, t in starts.items() if t == last)  # the highest on ties, as heapq.nlargest
    lead = last - second
    meaningful = lead >= min_lead_ns
    attrs = span_attributes(ranks[last_rank])
    op = attrs.get("nccl.op")
    middle = ordered[(len(ordered) - 1) // 2]  # statistics.median_low
    return Entry(last, last_rank if meaningful else None, lead, last - first, str(op), figures if meaningful else {},
                 offsets=tuple([t - middle for t in by_rank]), kind=hash((op, attrs.get("nccl.count"))))


def _gpu_summary(win: Window, rank: int, latest: int) -> dict[str, AttrValue]:
    """On the GPU, over the GPU-timed ones of the latest ``latest`` entries (what the raise or clear was decided
    over; 0: the whole window): how often ``rank``'s kernel started last, how often with its stream still busy
    (gpu_queue) rather than its host late, and by how much (median). Empty when none has its GPU side (no
    profiler plugin)."""
    timed = [e for e in (list(win.entries)[-latest:] if latest else win.entries) if e.gpu_timed]
    if not timed:
        return {}
    mine = [e for e in timed if e.gpu_rank == rank]
    attrs: dict[str, AttrValue] = {"nccl.straggler.gpu.timed": len(timed),
                                   "nccl.straggler.gpu.last_count": len(mine),
                                   "nccl.straggler.gpu.queued_count": sum(e.gpu_cause == "gpu_queue" for e in mine),
                                   "nccl.straggler.gpu.share": round(len(mine) / len(timed), 4)}
    if mine:
        attrs["nccl.straggler.gpu.lead_ns"] = int(statistics.median(e.gpu_lead_ns for e in mine))
    return attrs


def _identity(span: ReadableSpan) -> dict[str, AttrValue]:
    """Where the rank runs: its resource's host, pod, namespace, pid and its span's GPU (hw.id, nccl.device)."""
    attrs = span.attributes or {}
    found: dict[str, AttrValue] = {}
    for key, value in [(k, span.resource.attributes.get(k)) for k in _RESOURCE_KEYS] + \
            [(k, attrs.get(k)) for k in _SPAN_KEYS]:
        if isinstance(value, (str, int, float)):  # bool is an int: never one of these keys
            found[key] = value
    return found


def _summary(win: Window, rank: int, latest: int) -> dict[str, AttrValue]:
    """Share, counts, the medians of its lead and of the skew, and the mean of each "why late" figure over the
    window's collectives it was last in."""
    entries = list(win.entries)[-latest:] if latest else list(win.entries)
    mine = [e for e in entries if e.rank == rank]
    attrs: dict[str, AttrValue] = {
        "nccl.straggler.share": round(len(mine) / len(entries), 4), "nccl.straggler.last_count": len(mine),
        "nccl.straggler.window": len(entries), "nccl.straggler.window_ns": entries[-1].start_ns - entries[0].start_ns}
    if mine:
        attrs["nccl.straggler.lead_ns"] = int(statistics.median(e.lead_ns for e in mine))
        attrs["nccl.straggler.skew_ns"] = int(statistics.median(e.skew_ns for e in mine))
        attrs["nccl.ops"] = tuple(sorted({e.op for e in mine}))[:8]
    sums: dict[str, list[float]] = {}
    for e in mine:
        for key, value in e.figures.items():
            if key.startswith(_WHY) and isinstance(value, (int, float)) and not isinstance(value, bool):
                sums.setdefault(key, []).append(float(value))
    for key, values in sums.items():
        attrs[key] = sum(values) / len(values)
    return attrs


def _body(attrs: Mapping[str, Any]) -> str:
    """'rank 2 (host b, pod p, GPU 1 GPU-5d1e...) was last in 46 of the last 50 collectives (AllReduce) of comm X,
    ahead of the next-to-last by median 4.8 ms; why (mean per collective): off_cpu 3.9 ms (peers 0.1)'; for a
    rank slow on the GPU (kind gpu): 'rank 2 (...) started its kernel last in 46 of the last 50 GPU-timed
    collectives of comm X, its stream still busy (its host call on time) in 44, by median 4.1 ms'."""
    where = [f"host {attrs['host.name']}"] if "host.name" in attrs else []
    if "k8s.pod.name" in attrs:
        where.append(f"pod {attrs['k8s.pod.name']}")
    gpu = " ".join(str(attrs[k]) for k in ("nccl.device", "hw.id") if k in attrs)
    if gpu:
        where.append(f"GPU {gpu}")
    head = f"rank {attrs['nccl.rank']}" + (f" ({', '.join(where)})" if where else "")
    on_gpu = (f"started its kernel last in {attrs.get('nccl.straggler.gpu.last_count', 0)} of the last "
              f"{attrs.get('nccl.straggler.gpu.timed', 0)} GPU-timed collectives")
    queued = attrs.get("nccl.straggler.gpu.queued_count", 0)
    gpu_kind = attrs.get("nccl.straggler.kind") == "gpu"
    seen = (f"{on_gpu} of comm {attrs['nccl.comm.id']}, its stream still busy (its host call on time) in "
            f"{queued}" if gpu_kind else
            f"last in {attrs['nccl.straggler.last_count']} of the last {attrs['nccl.straggler.window']} "
            f"collectives ({', '.join(attrs.get('nccl.ops', ())) or 'none'}) of comm {attrs['nccl.comm.id']}")
    label = "persistent GPU straggler" if gpu_kind else "persistent straggler"
    if attrs["nccl.straggler.state"] == "cleared":
        return f"{label} cleared ({attrs.get('nccl.straggler.cleared.reason')}): {head} was {seen}"
    if gpu_kind:
        return f"{label}: {head} {seen}, by median {attrs.get('nccl.straggler.gpu.lead_ns', 0) / 1e6:.1f} ms"
    why = sorted(((k[len("nccl.straggler."):-len(".duration")], v) for k, v in attrs.items()
                  if k.startswith("nccl.straggler.") and k.endswith(".duration")
                  and k != "nccl.straggler.interval.duration"), key=lambda w: -w[1])
    why_text = ", ".join(f"{name} {value * 1e3:.1f} ms (peers "
                         f"{attrs.get(f'nccl.peers_median.{name}.duration', 0) * 1e3:.1f})" for name, value in why[:4])
    gpu_text = (f"; on the GPU it {on_gpu}, {queued} of them with its stream busy rather than its host late"
                if "nccl.straggler.gpu.timed" in attrs else "")
    return (f"{label}: {head} was {seen}, ahead of the next-to-last by median "
            f"{attrs.get('nccl.straggler.lead_ns', 0) / 1e6:.1f} ms" + (f"; why (mean per collective): {why_text}"
                                                                       if why_text else "") + gpu_text)
