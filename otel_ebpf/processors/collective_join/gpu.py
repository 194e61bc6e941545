"""The GPU side of one collective, joined over its ranks: every rank's GPU span (``nccl<Op> gpu``,
``nccl.timing = "gpu"``, from the agents' NCCL profiler plugin: processors/nccl/gpu.py) -> one span
``nccl <Op> gpu`` under the collective's root (span id ``derive_id(comm, seq, "gpu")``, parent
:func:`~otel_ebpf.core.ids.collective_root_span_id`), from the first rank's kernel start to the last rank's
kernel stop.

It says who was late on the GPU and why: ``nccl.gpu.skew_ns`` (first to last kernel start),
``nccl.gpu.late.rank`` (the rank whose kernel started last), ``nccl.gpu.late.queue_ns`` (how long that rank's
collective waited on its stream after its host call returned: ``nccl.gpu.queue_ns`` of its span) and
``nccl.gpu.late.cause``: of that rank's lead over the next-to-last kernel start, ``host`` when more of it was its
host call returning after that start (it arrived late), ``gpu_queue`` when more of it was its stream still busy
with earlier work (it ran slow on the GPU; also ``host`` when its queue was no longer than its peers'). Also
``nccl.gpu.duration_ns``, ``nccl.gpu.ranks.arrived``, ``nccl.algo`` / ``nccl.proto`` (the first rank's), and
``nccl.partial`` + ``nccl.missing_ranks`` when ranks are missing at ``timeout``.

Every rank's own GPU span passes on as it came. Bounded: ``max_pending`` collectives (oldest released early as
partial). Single-threaded (the join's).
"""
from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_ebpf.core.ids import collective_root_span_id, derive_id
from otel_ebpf.core.readable import ReadableSpan, SpanMaker

__all__ = ["GpuJoin", "is_gpu"]

Out = list[object]
# (comm id, seq, the joined span's attributes, the late rank's GPU span or None, out): each collective's GPU
# side once joined (the persistent-straggler window's GPU view, stragglers.PersistentStragglers.observe_gpu)
Joined = Callable[[str, int, dict[str, Any], ReadableSpan | None, Out], None]


def is_gpu(attrs: Mapping[str, Any]) -> bool:
    """A rank's GPU span, child of its host span; not a span from the profiler plugin alone (``nccl.source =
    "profiler_plugin"``: GPU-timed too, but the rank span itself, joined as any)."""
    return attrs.get("nccl.timing") == "gpu" and attrs.get("nccl.source") != "profiler_plugin"


@dataclass
class _Entry:
    nranks: int
    first: float
    trace_id: int
    ranks: dict[int, ReadableSpan] = field(default_factory=dict)


class GpuJoin:
    """Pending GPU spans per (comm id, seq); see the module doc."""

    def __init__(self, maker: SpanMaker, timeout: float, max_pending: int, max_ranks: int,
                 released: Callable[[str], None], joined: Joined | None = None) -> None:
        self._maker, self._timeout, self._max, self._max_ranks = maker, timeout, max_pending, max_ranks
        self._released, self._joined = released, joined
        self._pending: OrderedDict[tuple[str, int], _Entry] = OrderedDict()

    def add(self, span: ReadableSpan, attrs: Mapping[str, Any], now: float, out: Out) -> None:
        """A rank's GPU span: passed on, and kept for its collective's GPU span when it has the ids."""
        out.append(span)
        comm, seq, rank, nranks = (attrs.get(k) for k in ("nccl.comm.id", "nccl.seq", "nccl.rank", "nccl.nranks"))
        if type(comm) is not str or type(seq) is not int or type(rank) is not int or type(nranks) is not int \
                or not 0 <= rank < nranks <= self._max_ranks or "nccl.peer" in attrs:
            return
        key = (comm, seq)
        entry = self._pending.get(key)
        if entry is None:
            entry = self._pending[key] = _Entry(nranks, now, span.context.trace_id)
            while len(self._pending) > self._max:
                self._release(self._pending.popitem(last=False), out)
        entry.ranks[rank] = span
        if len(entry.ranks) >= entry.nranks:
            self._release((key, self._pending.pop(key)), out)

    def expire(self, now: float, out: Out) -> None:
        while self._pending:
            entry = next(iter(self._pending.values()))
            if now - entry.first < self._timeout:
                return
            self._release(self._pending.popitem(last=False), out)

    def drain(self, out: Out) -> None:
        while self._pending:
            self._release(self._pending.popitem(last=False), out)

    def _release(self, item: tuple[tuple[str, int], _Entry], out: Out) -> None:
        (comm, seq), entry = item
        spans = entry.ranks
        starts = {r: s.start_time or 0 for r, s in spans.items()}
        ends = {r: s.end_time or 0 for r, s in spans.items()}
        first_rank = min(spans)
        model = spans[first_rank].attributes or {}
        attrs: dict[str, Any] = {k: model[k] for k in ("nccl.op", "nccl.comm.id", "nccl.seq", "nccl.nranks",
                                                       "nccl.algo", "nccl.proto", "nccl.count", "nccl.datatype")
                                 if k in model}
        start, end = min(starts.values()), max(ends.values())
        attrs["nccl.timing"] = "gpu"
        attrs["nccl.gpu.duration_ns"] = end - start
        attrs["nccl.gpu.ranks.arrived"] = len(spans)
        if len(spans) > 1:
            late = max(starts, key=lambda r: (starts[r], r))
            attrs["nccl.gpu.skew_ns"] = starts[late] - min(starts.values())
            attrs["nccl.gpu.late.rank"] = late
            queues = {r: q for r, s in spans.items() if isinstance(q := (s.attributes or {}).get("nccl.gpu.queue_ns"),
                                                                     int)}
            if late in queues:
                attrs["nccl.gpu.late.queue_ns"] = queues[late]
                # its lead over the next-to-last kernel = (its host call's end - that kernel's start) + its queue:
                # the cause is the larger part. A host call that returned last by less than its stream was busy
                # (hosts in step within a millisecond, its stream 10 ms behind) is the GPU's, not the host's.
                others = [q for r, q in queues.items() if r != late]
                host_part = starts[late] - queues[late] - max(t for r, t in starts.items() if r != late)
                if host_part >= queues[late] or (others and queues[late] <= statistics.median(others)):
                    attrs["nccl.gpu.late.cause"] = "host"
                else:
                    attrs["nccl.gpu.late.cause"] = "gpu_queue"
        if len(spans) < entry.nranks:
            attrs["nccl.partial"] = True
            attrs["nccl.missing_ranks"] = tuple(r for r in range(entry.nranks) if r not in spans)
        self._released("complete" if len(spans) >= entry.nranks else "partial")
        out.append(self._maker.make(f"nccl {model.get('nccl.op', 'collective')} gpu", trace_id=entry.trace_id,
                                    span_id=derive_id(comm, seq, "gpu", bits=64),
                                    parent_span_id=collective_root_span_id(comm, seq), start_ns=start, end_ns=end,
                                    attributes=attrs))
        if self._joined is not None:
            last = attrs.get("nccl.gpu.late.rank")
            self._joined(comm, seq, attrs, spans.get(last) if isinstance(last, int) else None, out)
