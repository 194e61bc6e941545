"""The collective join: every rank's span of one NCCL collective -> one trace with one root.

Input: finished SDK spans (``ReadableSpan``, read through its API; new spans are built by
:mod:`otel_ebpf.core.readable`) from agents on any number of nodes, and ``Tick`` events.

* Rank span: attributes ``nccl.comm.id``, ``nccl.seq``, ``nccl.rank``, ``nccl.nranks`` and neither
  ``nccl.peer`` (send/recv spans: see below) nor ``nccl.captured`` (recorded into a CUDA graph: passed on as it
  is). A rank's GPU span (``nccl.timing = "gpu"``, the child of its rank span: processors/nccl/gpu.py) passes
  on and is joined with the other ranks' into the collective's GPU span (:mod:`.gpu`). Root span (sent by the
  process that is rank 0):
  ``nccl.comm.id`` and ``nccl.seq``, no ``nccl.rank``, no parent, and span id
  :func:`otel_ebpf.core.ids.collective_root_span_id` (the contract shared with the agents' nccl processor).
* Held per (comm id, seq) in a bounded :class:`~.store.Store` until all ``nranks`` rank spans
  arrived (``complete``), ``timeout`` after the first arrival (``partial``), or pushed out by
  the bounds (``evicted``, released as partial).
* On release: every rank span with ``nccl.wait_ns`` (last arrival's start - its start), and ONE
  root span from min start to max end (rank 0's, or synthesized with the derived ids on the
  gateway's resource with ``nccl.join.synthesized=true``) with ``nccl.skew_ns``,
  ``nccl.ranks.arrived``, ``nccl.straggler.rank``/``nccl.straggler.host`` (complete
  collectives: the rank that started last, host from its resource ``host.name``),
  ``nccl.straggler.X`` / ``nccl.peers_median.X`` for each ``ml.step.X`` host figure on the
  straggler's span (otel_ebpf.host.timeline.straggler_attributes: "why was it late"),
  ``nccl.partial=true`` + ``nccl.missing_ranks``, ``nccl.mismatch=true`` +
  ``nccl.mismatch.fields`` when ranks disagree on ``nccl.op``/``nccl.count``/``nccl.datatype``
  (or ``nccl.nranks``).
* Desync: once a collective has waited ``desync_timeout`` with ranks missing, at once: a
  ``nccl.desync`` event for its root span (``nccl.missing_ranks``, ``nccl.missing.hosts``,
  ``nccl.last_seq`` per rank, -1 = never seen), ``nccl.desync.count`` and a warning naming the
  missing ranks and each rank's last seq (at most one warning per communicator per
  ``desync_timeout``; the rest are counted in the next). Needs ``Tick`` events (or traffic). (:mod:`.desync`)
* Persistent stragglers (:mod:`.stragglers`): a rank last to arrive (by ``min_lead`` at least) in ``ratio`` of a
  communicator's recent complete collectives is named once (an ``otel_ebpf.nccl.straggler`` log record, the
  ``nccl.straggler.persistent`` gauge, a warning, a ``nccl.straggler.persistent`` event on the deciding root
  span) and cleared once when it recovers (``persistent_straggler`` config).
* Split children the agent could not rank (no ``nccl.rank``, but ``nccl.parent.rank``): ranked
  here from every parent rank's ``ncclCommSplit`` span (:mod:`.splits`), held until then
  (``max_spans`` spans at most, each ``timeout`` at most; released unranked, counted in
  ``otel_ebpf.collective_join.unjoined{reason=split_unresolved}``), then joined as any rank span (their
  send/recv: as any ranked send/recv, below).
* Grouped send/recv (uneven all-to-all, gather, scatter, ``batch_isend_irecv``, pipeline send/recv):
  every rank's group that exchanges them joined as ONE instance, root ``nccl GroupP2P`` (:mod:`.p2p`).
* Late spans (their collective already released) pass through; late root spans are dropped
  (a root with that id was already sent). Both count in ``nccl.join.late{nccl.span}``.

Metrics (gateway resource, scope ``otel_ebpf.collective_join``): ``nccl.collective.skew`` (s)
{nccl.comm.id, nccl.op}, ``nccl.straggler.count`` {nccl.rank, host.name},
``nccl.desync.count`` {nccl.comm.id, nccl.op}, ``nccl.join.released`` {outcome},
``nccl.join.p2p.released`` {outcome} (grouped send/recv: apart, so straggler ratios stay per collective),
``nccl.join.late`` {nccl.span}, ``nccl.straggler.persistent`` {nccl.comm.id, nccl.rank, host.name} (gauge),
``nccl.straggler.comms.evicted``. Everything else passes through unchanged.

Sharding by trace id (the Collector's ``loadbalancing`` exporter, ``routing_key: traceID``)
gives the same spans as one instance: every span of one collective shares its trace id.
Single-threaded (one pipeline worker); ``shutdown`` releases what is pending, as partial. A rank span given to
``consume`` becomes the join's: released, it is passed on with ``nccl.wait_ns`` added to its own attribute dict
(an SDK ``ReadableSpan`` whose attributes are a plain dict, as otlp_in and core.readable make them), so a caller
must not reuse it. Copying the span instead held the join to 367k rank spans/s against 589k (bench/gateway.py,
1,024 ranks in order, docs/benchmarks.md session 25). A rank span received over OTLP then leaves as the bytes it
came as with ``nccl.wait_ns`` spliced in (otel_ebpf.emit.otlp_common.RECEIVED_SPAN): the only change the join
makes in place; every other is a new span (``with_changes``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from otel_ebpf.core.events import AttrValue
from otel_ebpf.core.ids import COLLECTIVE_ROOT_ATTRIBUTES, collective_ids, collective_root_span_id
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.core.processing import EventProcessor, handles
from otel_ebpf.core.readable import (
    ReadableLogRecord,
    ReadableSpan,
    SpanMaker,
    log_fields,
    resource_attribute,
    span_attributes,
    span_times,
    with_changes,
)
from otel_ebpf.host.identity import gateway_resource_attributes
from otel_ebpf.host.timeline import has_step_figures, straggler_attributes

from .config import Config
from .desync import DesyncReports
from .gpu import GpuJoin, is_gpu
from .hangs import HangStacks
from .intake import intake
from .metrics import METRICS
from .p2p import P2PJoin, is_p2p
from .splits import SplitBook, split_call
from .store import Collective, Store
from .stragglers import PersistentStragglers

__all__ = ["METRICS", "SCOPE", "CollectiveJoin", "create"]

SCOPE = "otel_ebpf.collective_join"
log = logging.getLogger(__name__)
_SIG = ("nccl.op", "nccl.count", "nccl.datatype")
_NAMED = frozenset({"ncclCommSplit", "ncclSend", "ncclRecv", "ncclGroup"})  # spans _any_span reads by name
Out = list[object]


class CollectiveJoin(EventProcessor[Config]):
    """Consumer joining NCCL rank spans; see the module doc. ``clock`` (monotonic seconds) and
    ``wall_ns`` (epoch ns, for event times) are injectable for tests. Takes SDK ``ReadableSpan``
    objects of exactly that class (what ``otel_ebpf.emit.otlp_in`` and ``core.readable`` build)."""

    NAME = "collective_join"
    SCOPE = SCOPE
    METRICS = METRICS

    def __init__(self, config: Config, ctx: Context, next_: Consumer, *,
                 clock: Callable[[], float] = time.monotonic, wall_ns: Callable[[], int] = time.time_ns,
                 c_intake: bool = True) -> None:
        super().__init__(config, ctx, next_)
        self.store = Store(config.max_pending, config.max_spans, config.max_comms)
        self._take = intake(self.store, _NAMED, config.max_ranks) if c_intake else None  # None: all in Python
        self.splits = SplitBook(config.max_comms, config.max_spans, config.timeout)
        self._clock = clock
        self._wall_ns = wall_ns
        self._timeout = config.timeout
        self._max_ranks = config.max_ranks
        self._desync = config.effective_desync_timeout
        self._maker = SpanMaker(gateway_resource_attributes(), SCOPE)
        self.p2p = P2PJoin(config.max_pending, config.max_spans, config.timeout, self._maker,
                           lambda outcome: self._count("nccl.join.p2p.released", outcome=outcome),
                           lambda: self._count("nccl.join.late", **{"nccl.span": "p2p"}))
        self.gpu = GpuJoin(self._maker, config.timeout, config.max_pending, config.max_ranks,
                           lambda outcome: self._count("nccl.join.gpu.released", outcome=outcome),
                           lambda comm, seq, attrs, late, out: self.persistent.observe_gpu(comm, seq, attrs, late,
                                                                                          self._now, out))
        self.hangs = HangStacks(config.max_stacks, config.max_comms, config.stack_max_age, SCOPE, wall_ns,
                                self._front_seq, lambda: self._unjoined("stack_evicted"))
        self.desync = DesyncReports(self.store, self._desync, config.max_comms, wall_ns, lambda comm, op: self._count(
            "nccl.desync.count", **{"nccl.comm.id": comm, "nccl.op": op}), self.hangs)
        self.persistent = PersistentStragglers(config.persistent_straggler, METRICS, SCOPE, wall_ns,
                                               lambda: self._count("nccl.straggler.comms.evicted"))
        self._now = clock()  # clock() at the start of the batch being consumed
        self._pending_metrics: Out = []  # skew records, sent after the batch's spans

    def shutdown(self) -> None:
        """Release everything pending (as partial) to the next stage. Safe twice."""
        out: Out = []
        self._unresolved(self.splits.drain(), out)
        self.p2p.drain(out)
        self.gpu.drain(out)
        for entry in self.store.pending():
            self._release(self.store.pop(entry.key), "partial", out)
        self._flush_metrics(out)
        self.store.clear()
        self.splits.clear()
        self.p2p.clear()
        if out:
            self._next.consume(out)

    def consume(self, events: Sequence[object]) -> None:
        """Spans are joined, everything else (Tick included) passes on; then what timed out is
        released (:meth:`end_batch`). The rank spans that only join a pending collective are taken in C where the
        extension is built (:mod:`.intake`), everything else here, each in its order."""
        self._now = self._clock()
        if self._take is None:
            super().consume(events)
            return
        out: Out = []
        i, n = 0, len(events)
        while (i := self._taken(events, i)) < n:
            self.dispatch((events[i],), out)
            i += 1
        self.end_batch(out)
        if out:
            self._next.consume(out)

    def _taken(self, events: Sequence[object], start: int) -> int:
        """The index of the first event from ``start`` on that the C intake did not take (``start`` without it)."""
        if (take := self._take) is None:
            return start
        try:
            return take(events, start)
        except Exception:  # only before it takes any (its arguments, the store's fields): the rest in Python
            log.warning("collective_join: the C intake failed, joining in Python from here on", exc_info=True)
            self._take = None
            return start

    def failed(self, event: object, out: Out) -> None:
        """A span that could not be joined is counted and passed on unchanged."""
        self._unjoined("error")
        out.append(event)

    def end_batch(self, out: Out) -> None:
        self._expire(self._now, out)
        self.gpu.expire(self._now, out)
        self.persistent.expire(self._now, out)
        self._flush_metrics(out)

    def _flush_metrics(self, out: Out) -> None:
        out.extend(self._pending_metrics)
        self._pending_metrics.clear()
        self.sums.flush(out)

    # ---- intake ----------------------------------------------------------------------
    def _unjoined(self, reason: str) -> None:
        self.ctx.telemetry.add("otel_ebpf.collective_join.unjoined", 1, reason=reason)

    @handles(ReadableLogRecord)
    def _log(self, rec: ReadableLogRecord, out: Out) -> None:
        """A silent rank's stack (core.rankstack) is kept for the desync reports (:mod:`.hangs`); every log
        record passes on."""
        out.append(rec)
        name, attrs, body, resource = log_fields(rec)
        if self.hangs.is_stack(name):
            self.hangs.add(attrs, body, resource, self._now, out)

    def _front_seq(self, comm: str, rank: int) -> int:
        front = self.store.front(comm)
        return front.seqs.get(rank, -1) if front is not None else -1

    @handles(ReadableSpan)
    def _span(self, span: ReadableSpan, out: Out) -> None:
        attrs = span_attributes(span)
        get = attrs.get
        rank, nranks = get("nccl.rank"), get("nccl.nranks")
        # The common case first, in one test: a ranked collective call (what every rank sends for each), for which
        # each check of _any_span below falls through to _ranked. A third of the join's own CPU went to those
        # checks one by one (bench/gateway.py under py-spy, session 26).
        if type(rank) is int and type(nranks) is int and 0 <= rank < nranks <= self._max_ranks \
                and type(comm := get("nccl.comm.id")) is str and type(seq := get("nccl.seq")) is int \
                and (span._name if type(span) is ReadableSpan else span.name) not in _NAMED \
                and not get("nccl.captured") and get("nccl.timing") != "gpu" and "nccl.peer" not in attrs:
            self._ranked(span, attrs, comm, seq, rank, nranks, out)
            return
        self._any_span(span, attrs, out)

    def _any_span(self, span: ReadableSpan, attrs: Mapping[str, Any], out: Out) -> None:
        now = self._now
        if span.name == "ncclCommSplit" and (call := split_call(attrs)) is not None:
            out.append(span)
            for child in self.splits.record(call):
                for waited in self.splits.take(child):
                    self._span(waited, out)
            return
        if attrs.get("nccl.captured"):  # recorded into a CUDA graph, not run: no arrival to join
            out.append(span)
            return
        if is_gpu(attrs):  # a rank's GPU span: passed on, joined into the collective's GPU span (.gpu)
            self.gpu.add(span, attrs, now, out)
            return
        if (ranked := self._split_ranked(span, attrs, now)) is None:
            return
        span, attrs = ranked
        if is_p2p(span, attrs):
            self.p2p.add(span, attrs, now, out)
            return
        comm = attrs.get("nccl.comm.id")
        seq = attrs.get("nccl.seq")
        if type(comm) is not str or type(seq) is not int or "nccl.peer" in attrs:
            out.append(span)
            return
        rank = attrs.get("nccl.rank")
        if rank is None:
            if span.parent is None and span.context.span_id == collective_root_span_id(comm, seq):
                self._root(span, attrs, (comm, seq), now, out)
            else:
                out.append(span)
            return
        nranks = attrs.get("nccl.nranks")
        if type(rank) is not int or type(nranks) is not int or not 0 <= rank < nranks <= self.config.max_ranks:
            self._unjoined("bad_rank")
            out.append(span)
            return
        self._ranked(span, attrs, comm, seq, rank, nranks, out)

    def _ranked(self, span: ReadableSpan, attrs: Mapping[str, Any], comm: str, seq: int, rank: int, nranks: int,
                out: Out) -> None:
        """A rank span of collective (comm, seq), 0 <= rank < nranks <= max_ranks: held, or passed on."""
        key = (comm, seq)
        entry = self.store.get(key)
        if entry is None:
            if self.store.was_released(key):
                self._late(span, "rank", out)
                return
            entry = self._new(key, span.context.trace_id, nranks, self._now, out)
        elif rank in entry.ranks or rank >= entry.nranks:
            self._unjoined("duplicate_rank" if rank in entry.ranks else "bad_rank")
            out.append(span)
            return
        self._add(entry, span, attrs, rank, nranks, out)

    def _split_ranked(self, span: ReadableSpan, attrs: Mapping[str, Any],
                      now: float) -> tuple[ReadableSpan, Mapping[str, Any]] | None:
        """``(span, attrs)`` as they came or, for a split child's call its agent could not rank (``nccl.parent.rank``,
        no ``nccl.rank``), ranked from the split: a collective under the ids its agent would have given, a send/recv
        with its ids (its ``nccl.peer`` is a child rank: NCCL's API); None while held (:class:`~.splits.SplitBook`)."""
        comm, seq, parent_rank = attrs.get("nccl.comm.id"), attrs.get("nccl.seq"), attrs.get("nccl.parent.rank")
        if attrs.get("nccl.rank") is not None or type(comm) is not str or type(seq) is not int \
                or type(parent_rank) is not int:
            return span, attrs
        ranked = self.splits.lookup(comm, parent_rank)
        if ranked is None:
            self.splits.wait(comm, span, now)
            return None
        attrs = {**attrs, "nccl.rank": ranked[0], "nccl.nranks": ranked[1]}
        if "nccl.peer" in attrs:
            return with_changes(span, attrs), attrs
        _, root_id, own_id = collective_ids(comm, seq, ranked[0])  # as the agent would have
        return with_changes(span, attrs, ids=(own_id, root_id)), attrs

    def _add(self, entry: Collective, span: ReadableSpan, attrs: Mapping[str, Any], rank: int, nranks: int,
             out: Out) -> None:
        sig = (attrs.get("nccl.op"), attrs.get("nccl.count"), attrs.get("nccl.datatype"))
        if entry.sig is None:
            entry.sig = sig
        elif sig != entry.sig:
            differ = {f for f, a, b in zip(_SIG, sig, entry.sig, strict=True) if a != b}
            entry.mismatch = (entry.mismatch or set()) | differ
        if nranks != entry.nranks:
            entry.mismatch = (entry.mismatch or set()) | {"nccl.nranks"}
        for old in self.store.make_room(entry):
            self._release(old, "evicted", out)
        entry.add(rank, span)
        self.store.spans += 1
        self.store.advance(entry.key[0], rank, entry.key[1], span._resource if type(span) is ReadableSpan
                           else span.resource)
        if len(entry.ranks) >= entry.nranks:
            self.hangs.progressed(*entry.key)
            self._release(self.store.pop(entry.key), "complete", out)

    def _new(self, key: tuple[str, int], trace_id: int, nranks: int, now: float, out: Out) -> Collective:
        entry, evicted = self.store.add(key, trace_id, nranks, now)
        for old in evicted:
            self._release(old, "evicted", out)
        return entry

    def _root(self, span: ReadableSpan, attrs: Mapping[str, Any], key: tuple[str, int], now: float, out: Out) -> None:
        entry = self.store.get(key)
        if entry is None:
            if self.store.was_released(key):
                self._late(span, "root", out, keep=False)
                return
            nranks = attrs.get("nccl.nranks")
            if type(nranks) is not int or not 0 < nranks <= self.config.max_ranks:
                nranks = 1
            entry = self._new(key, span.context.trace_id, nranks, now, out)
        if entry.root is not None:
            self._unjoined("duplicate_root")
            return
        entry.root = span

    def _late(self, span: ReadableSpan, kind: str, out: Out, keep: bool = True) -> None:
        self._count("nccl.join.late", **{"nccl.span": kind})
        if keep:
            out.append(span)

    # ---- time ------------------------------------------------------------------------
    def _unresolved(self, spans: list[ReadableSpan], out: Out) -> None:
        for span in spans:
            self._unjoined("split_unresolved")
            out.append(span)

    def _expire(self, now: float, out: Out) -> None:
        self._unresolved(self.splits.expired(now), out)
        self.p2p.expired(now, out)
        store = self.store
        while (entry := store.oldest_unchecked()) is not None and now - entry.first >= self._desync:
            store.checked(entry)
            self.desync.report(entry, now, out)
        while (entry := store.oldest()) is not None and now - entry.first >= self._timeout:
            self._release(store.pop(entry.key), "partial", out)

    # ---- release ---------------------------------------------------------------------
    def _release(self, entry: Collective, outcome: str, out: Out) -> None:
        self._count("nccl.join.released", outcome=outcome)
        ranks = entry.ranks
        join: dict[str, Any] = {}
        start = end = None
        if ranks:
            start, last, last_rank, end = entry.arrivals()
            for span, began in zip(ranks.values(), entry.starts.values(), strict=True):
                wait = last - began
                own = span._attributes if type(span) is ReadableSpan else None
                if type(own) is dict:  # the join's own span (module doc): nccl.wait_ns added in place
                    own["nccl.wait_ns"] = wait
                    out.append(span)
                else:
                    attrs = dict(span_attributes(span))
                    attrs["nccl.wait_ns"] = wait
                    out.append(with_changes(span, attrs))
            join["nccl.skew_ns"] = last - start
            self._skew(entry, ranks[last_rank], (last - start) / 1e9)
            if len(ranks) == entry.nranks:
                host = resource_attribute(ranks[last_rank], "host.name")
                join["nccl.straggler.rank"] = last_rank
                join["nccl.straggler.host"] = "" if host is None else str(host)
                why = straggler_attributes({r: span_attributes(sp) for r, sp in ranks.items()}, last_rank) \
                    if has_step_figures(span_attributes(ranks[last_rank])) else {}
                join.update(why)
                if entry.nranks > 1:
                    dims: dict[str, AttrValue] = {"nccl.rank": last_rank, "host.name": str(host)}
                    self._count("nccl.straggler.count", **dims)
                    if event := self.persistent.observe(entry.key, entry.trace_id, ranks, why, self._now, out,
                                                        entry.starts):
                        entry.events.append(event)
        join["nccl.ranks.arrived"] = len(ranks)
        if len(ranks) < entry.nranks:
            join["nccl.partial"] = True
            join["nccl.missing_ranks"] = tuple(entry.missing())
        if entry.mismatch:
            join["nccl.mismatch"] = True
            join["nccl.mismatch.fields"] = tuple(sorted(entry.mismatch))
        out.append(self._root_span(entry, join, start, end))

    def _skew(self, entry: Collective, straggler: ReadableSpan, skew_s: float) -> None:
        if len(entry.ranks) < 2:
            return
        attrs = span_attributes(straggler)
        dims = {"nccl.comm.id": entry.key[0], "nccl.op": str(attrs.get("nccl.op"))}
        self.metric(self._pending_metrics, None, "nccl.collective.skew", skew_s, dims)

    def _root_span(self, entry: Collective, join: dict[str, Any], start: int | None,
                   end: int | None) -> ReadableSpan:
        root = entry.root
        if root is not None:
            attrs = dict(span_attributes(root))
            attrs.update(join)
            root_start, root_end = span_times(root)
            return with_changes(root, attrs, start_ns=min(root_start, start or root_start),
                                end_ns=max(root_end, end or root_end), events=entry.events)
        comm, seq = entry.key
        model = span_attributes(next(iter(entry.ranks.values())))  # no root: at least one rank span
        attrs = {k: model[k] for k in COLLECTIVE_ROOT_ATTRIBUTES if k in model}
        attrs["nccl.join.synthesized"] = True
        attrs.update(join)
        return self._maker.make(f"nccl {model.get('nccl.op', 'collective')}", trace_id=entry.trace_id,
                                span_id=collective_root_span_id(comm, seq), parent_span_id=None,
                                start_ns=start or 0, end_ns=end or 0, attributes=attrs, events=entry.events)

    # ---- metrics ---------------------------------------------------------------------
    def _count(self, name: str, **attrs: AttrValue) -> None:
        self.sums.add(None, name, 1, attrs)  # int sums, as before the shared Sums


def create(config: Config, ctx: Context, next_: Consumer) -> CollectiveJoin:
    return CollectiveJoin(config, ctx, next_)
