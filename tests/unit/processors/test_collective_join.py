"""otel_ebpf/processors/collective_join: rank spans of one NCCL collective -> one trace with one root."""
from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

from otel_ebpf.core.ids import collective_ids, derive_id
from otel_ebpf.core.events import MetricRecord, Tick
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.collective_join import CollectiveJoin, Config, factory
from tests.support import nccl_spans
from tests.support.nccl_spans import COMM, node

T0 = 1_700_000_000_000_000_000
NODES = {h: node(h) for h in ("node-a", "node-b")}


def rank_span(seq: int, rank: int, start: int, **kw) -> ReadableSpan:
    return nccl_spans.rank_span(seq, rank, T0 + start, **kw)


def root_span(seq: int, start: int, **kw) -> ReadableSpan:
    return nccl_spans.root_span(seq, T0 + start, **kw)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sink() -> ListConsumer:
    return ListConsumer()


SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def make(sink: ListConsumer, clock: Clock, **cfg) -> CollectiveJoin:
    return CollectiveJoin(Config(**cfg), Context(), sink, clock=clock, wall_ns=lambda: T0 + 99)


def spans(events) -> list[ReadableSpan]:
    return [e for e in events if isinstance(e, ReadableSpan)]


def roots(events) -> list[ReadableSpan]:
    return [s for s in spans(events) if s.parent is None]


def metric(events, name: str, **attrs) -> float:
    return sum(e.value for e in events if isinstance(e, MetricRecord) and e.name == name
               and all(e.attributes.get(k) == v for k, v in attrs.items()))


def by_rank(events) -> dict[int, ReadableSpan]:
    return {s.attributes["nccl.rank"]: s for s in spans(events) if "nccl.rank" in s.attributes}


def test_complete_collective_is_one_trace_with_one_root_and_resolving_parents(sink, clock):
    join = make(sink, clock)
    join.consume([rank_span(7, r, 100 * r) for r in range(4)])
    out = sink.take()
    assert len(spans(out)) == 5
    (root,) = roots(out)
    assert root.context.span_id == derive_id(COMM, 7, "collective", bits=64)
    assert {s.context.trace_id for s in spans(out)} == {derive_id(COMM, 7)}
    assert all(s.parent.span_id == root.context.span_id for s in spans(out) if s is not root)
    assert root.attributes["nccl.ranks.arrived"] == 4 and "nccl.partial" not in root.attributes
    assert metric(out, "nccl.join.released", outcome="complete") == 1
    assert len(join.store) == 0


def test_straggler_is_named_with_its_host_and_wait_ns_and_skew_are_exact(sink, clock):
    join = make(sink, clock)
    starts = {0: 100, 1: 110, 2: 130, 3: 105}  # rank 2 (node-b) starts last
    join.consume([rank_span(1, r, s, dur=50) for r, s in starts.items()])
    out = sink.take()
    (root,) = roots(out)
    assert root.attributes["nccl.straggler.rank"] == 2
    assert root.attributes["nccl.straggler.host"] == "node-b"
    assert root.attributes["nccl.skew_ns"] == 30
    assert {r: s.attributes["nccl.wait_ns"] for r, s in by_rank(out).items()} == {0: 30, 1: 20, 2: 0, 3: 25}
    assert (root.start_time, root.end_time) == (T0 + 100, T0 + 180)  # first arrival .. last completion
    assert metric(out, "nccl.straggler.count", **{"nccl.rank": 2, "host.name": "node-b"}) == 1
    (skew,) = [e for e in out if isinstance(e, MetricRecord) and e.name == "nccl.collective.skew"]
    assert skew.value == pytest.approx(30e-9) and skew.unit == "s" and skew.attributes["nccl.comm.id"] == COMM


def test_rank0_root_span_is_kept_extended_and_not_duplicated(sink, clock):
    join = make(sink, clock)
    join.consume([root_span(2, 0), rank_span(2, 0, 0), rank_span(2, 1, 40)])
    assert not sink.events  # still waiting for ranks 2 and 3
    join.consume([rank_span(2, 2, 10), rank_span(2, 3, 20, dur=5000)])
    out = sink.take()
    (root,) = roots(out)
    assert root.resource is NODES["node-a"] and root.name == "nccl AllReduce"
    assert "nccl.join.synthesized" not in root.attributes
    assert (root.start_time, root.end_time) == (T0, T0 + 5020)


def test_missing_root_is_synthesized_on_the_gateway_resource(sink, clock):
    join = make(sink, clock)
    join.consume([rank_span(3, r, r) for r in (1, 2, 3, 0)])
    (root,) = roots(sink.take())
    assert root.resource.attributes["service.name"] == "otel-ebpf-gateway"
    assert root.attributes["nccl.join.synthesized"] is True
    assert root.context.span_id == derive_id(COMM, 3, "collective", bits=64)
    assert root.name == "nccl AllReduce" and root.attributes["nccl.bytes"] == 4096


def test_partial_after_timeout_names_the_missing_ranks(sink, clock):
    join = make(sink, clock, timeout=5.0)
    join.consume([rank_span(4, r, r) for r in (0, 1, 3)])
    clock.t = 4.9
    join.consume([Tick(0)])
    assert spans(sink.events) == []
    clock.t = 5.0
    join.consume([Tick(0)])
    out = sink.take()
    (root,) = roots(out)
    assert root.attributes["nccl.partial"] is True
    assert root.attributes["nccl.missing_ranks"] == (2,)
    assert root.attributes["nccl.ranks.arrived"] == 3
    assert "nccl.straggler.rank" not in root.attributes  # the missing rank is the straggler
    assert len(by_rank(out)) == 3
    assert metric(out, "nccl.join.released", outcome="partial") == 1


def test_mismatched_ranks_are_flagged(sink, clock):
    join = make(sink, clock)
    join.consume([rank_span(5, 0, 0), rank_span(5, 1, 0), rank_span(5, 2, 0, count=2048),
                  rank_span(5, 3, 0, op="Broadcast")])
    (root,) = roots(sink.take())
    assert root.attributes["nccl.mismatch"] is True
    assert root.attributes["nccl.mismatch.fields"] == ("nccl.count", "nccl.op")


def test_late_rank_passes_through_unchanged_and_late_root_is_dropped(sink, clock):
    join = make(sink, clock, timeout=1.0)
    join.consume([rank_span(6, r, r) for r in range(3)])
    clock.t = 2.0
    join.consume([])
    sink.take()
    late, late_root = rank_span(6, 3, 3), root_span(6, 0)
    join.consume([late, late_root])
    out = sink.take()
    assert spans(out) == [late]  # unchanged object, no wait_ns; the root already went out
    assert metric(out, "nccl.join.late", **{"nccl.span": "rank"}) == 1
    assert metric(out, "nccl.join.late", **{"nccl.span": "root"}) == 1


def test_full_store_releases_the_oldest_early_and_counts_it(sink, clock):
    join = make(sink, clock, max_pending=2)
    join.consume([rank_span(seq, 0, 0) for seq in range(3)])
    out = sink.take()
    (root,) = roots(out)
    assert root.attributes["nccl.seq"] == 0 and root.attributes["nccl.partial"] is True
    assert metric(out, "nccl.join.released", outcome="evicted") == 1
    assert len(join.store) == 2


def test_span_bound_releases_the_oldest_collectives(sink, clock):
    join = make(sink, clock, max_spans=3)
    join.consume([rank_span(0, 0, 0), rank_span(0, 1, 0), rank_span(1, 0, 0), rank_span(1, 1, 0)])
    out = sink.take()
    assert [r.attributes["nccl.seq"] for r in roots(out)] == [0]
    assert join.store.spans == 2


def test_desync_is_reported_while_the_job_hangs_then_on_the_root(sink, clock, caplog):
    join = make(sink, clock, timeout=5.0, desync_timeout=1.0)
    for seq in range(3):  # three good collectives, then rank 3 stops sending
        join.consume([rank_span(seq, r, 10 * seq) for r in range(4)])
    join.consume([rank_span(3, r, 30) for r in range(3)])
    clock.t = 0.5
    join.consume([rank_span(4, r, 40) for r in range(3)])  # enqueued behind the hang
    sink.take()
    clock.t = 1.0
    with caplog.at_level(logging.WARNING, logger="otel_ebpf.processors.collective_join"):
        join.consume([Tick(0)])
    out = sink.take()
    assert metric(out, "nccl.desync.count", **{"nccl.comm.id": COMM}) == 1
    assert spans(out) == []  # not released yet: the job is still hung
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "seq 3" in msg and "for ranks 3 of 4" in msg and "hosts: node-b" in msg
    assert "4: ranks 0-2" in msg and "2: ranks 3" in msg
    clock.t = 1.5
    with caplog.at_level(logging.WARNING, logger="otel_ebpf.processors.collective_join"):
        join.consume([Tick(0)])  # seq 4 is hung too: counted, not logged again so soon
    assert metric(sink.take(), "nccl.desync.count") == 1 and len(caplog.records) == 1
    clock.t = 5.0
    join.consume([Tick(0)])
    (root,) = roots(sink.take())
    (event,) = root.events
    assert event.name == "nccl.desync" and event.timestamp == T0 + 99
    assert event.attributes["nccl.missing_ranks"] == (3,)
    assert event.attributes["nccl.last_seq"] == (4, 4, 4, 2)
    assert event.attributes["nccl.missing.hosts"] == ("node-b",)


def test_unrelated_spans_p2p_and_other_events_pass_through_unchanged(sink, clock):
    join = make(sink, clock)
    other = ReadableSpan("forward", context=SpanContext(1, 2, False, SAMPLED), resource=NODES["node-a"],
                         attributes={"x": 1}, start_time=T0, end_time=T0 + 1)
    p2p = ReadableSpan("ncclSend", context=SpanContext(3, 4, False, SAMPLED), resource=NODES["node-a"],
                       attributes={"nccl.comm.id": COMM, "nccl.seq": 1, "nccl.peer": 1},
                       start_time=T0, end_time=T0 + 1)  # unranked, no nccl.parent.rank to rank it by: no p2p join
    bad = rank_span(9, 5, 0)  # rank 5 of 4
    tick, record = Tick(5), MetricRecord(None, "m", "counter", 1, {})
    join.consume([other, p2p, tick, record, bad])
    assert sink.take() == [other, p2p, tick, record, bad]
    assert join.ctx.telemetry.get("otel_ebpf.collective_join.unjoined", reason="bad_rank") == 1


def test_captured_rank_and_p2p_spans_pass_through_unjoined(sink, clock):
    """Work recorded into a CUDA graph during a stream capture (``nccl.captured``) has no arrival to join."""
    join = make(sink, clock)
    captured = [ReadableSpan(s.name, context=s.context, parent=s.parent, resource=s.resource,
                             attributes={**s.attributes, "nccl.captured": True}, start_time=s.start_time,
                             end_time=s.end_time) for s in (rank_span(3, r, 0) for r in range(4))]
    send = ReadableSpan("ncclSend", context=SpanContext(3, 4, False, SAMPLED), resource=NODES["node-a"],
                        attributes={"nccl.comm.id": COMM, "nccl.seq": 1, "nccl.peer": 1, "nccl.rank": 0,
                                    "nccl.captured": True}, start_time=T0, end_time=T0 + 1)
    join.consume([*captured, send])
    assert sink.take() == [*captured, send]
    assert join.store.get((COMM, 3)) is None


def test_shutdown_releases_pending_as_partial_and_is_safe_twice(sink, clock):
    join = make(sink, clock)
    join.consume([rank_span(8, 0, 0)])
    join.shutdown()
    join.shutdown()
    (root,) = roots(sink.take())
    assert root.attributes["nccl.missing_ranks"] == (1, 2, 3)


def _canonical(events):
    return sorted((s.context.trace_id, s.context.span_id, s.parent and s.parent.span_id, s.name,
                   tuple(sorted((k, str(v)) for k, v in s.attributes.items())), s.start_time, s.end_time)
                  for s in spans(events))


def test_sharding_by_trace_id_gives_the_same_spans_as_one_instance(clock):
    inputs = [rank_span(seq, r, (seq * 7 + r * 13) % 50) for seq in range(20) for r in range(4)]
    inputs += [root_span(seq, 0) for seq in range(0, 20, 3)]
    single = ListConsumer()
    make(single, clock).consume(inputs)
    shards = [ListConsumer(), ListConsumer()]
    joins = [make(s, clock) for s in shards]
    for span in inputs:
        joins[span.context.trace_id % 2].consume([span])
    assert _canonical(shards[0].events + shards[1].events) == _canonical(single.events)


def test_factory_and_config_validation():
    from otel_ebpf.core.config import build
    from otel_ebpf.core.errors import ConfigError

    assert factory.type == "collective_join"
    cfg = build(Config, {"timeout": "2s", "desync_timeout": "500ms"}, "processors.collective_join")
    assert (cfg.timeout, cfg.effective_desync_timeout) == (2.0, 0.5)
    assert build(Config, {}).effective_desync_timeout == 5.0
    with pytest.raises(ConfigError, match=r"processors\.collective_join\.desync_timeout"):
        build(Config, {"timeout": "1s", "desync_timeout": "2s"}, "processors.collective_join")
    with pytest.raises(ConfigError, match=r"processors\.collective_join\.max_pending"):
        build(Config, {"max_pending": 0}, "processors.collective_join")


def test_a_ranks_gpu_span_passes_through_and_the_collective_still_joins(sink, clock):
    join = make(sink, clock)
    gpu = rank_span(8, 1, 500)
    gpu = ReadableSpan("ncclAllReduce gpu", context=SpanContext(gpu.context.trace_id, 0x77, False, SAMPLED),
                       parent=gpu.context, resource=gpu.resource,
                       attributes={**gpu.attributes, "nccl.timing": "gpu"}, start_time=gpu.start_time,
                       end_time=gpu.end_time, instrumentation_scope=gpu.instrumentation_scope)
    join.consume([gpu])
    assert spans(sink.take()) == [gpu]  # not taken as rank 1's arrival
    join.consume([rank_span(8, r, 100 * r) for r in range(4)])
    out = sink.take()
    assert metric(out, "nccl.join.released", outcome="complete") == 1


def gpu_span(seq: int, rank: int, start: int, dur: int, queue: int, nranks: int = 4) -> ReadableSpan:
    """Rank ``rank``'s GPU span (processors/nccl/gpu.py): a child of its rank span, kernel from ``start``."""
    host = rank_span(seq, rank, 0, nranks=nranks)
    return ReadableSpan("ncclAllReduce gpu", context=SpanContext(host.context.trace_id, 0x900 + rank, False, SAMPLED),
                        parent=host.context, resource=host.resource,
                        attributes={**host.attributes, "nccl.timing": "gpu", "nccl.algo": "RING",
                                    "nccl.proto": "SIMPLE", "nccl.gpu.queue_ns": queue},
                        start_time=T0 + start, end_time=T0 + start + dur,
                        instrumentation_scope=host.instrumentation_scope)


def test_every_ranks_gpu_span_joins_into_the_collectives_gpu_span_naming_who_was_late_and_why(sink, clock):
    join = make(sink, clock)
    # rank 2's host call returned on time (1000 like the others) but its stream was busy: its kernel started
    # 5000 after the others' (queue 6000 vs 1000): it ran slow on the GPU, it did not arrive late
    join.consume([gpu_span(9, r, 2000 if r != 2 else 7000, 9000 if r != 2 else 4000, 1000 if r != 2 else 6000)
                  for r in range(4)])
    out = spans(sink.take())
    assert len(out) == 5  # the 4 rank GPU spans pass on, plus the collective's
    (g,) = [s for s in out if s.name == "nccl AllReduce gpu"]
    trace, root, _ = collective_ids(COMM, 9, 0)
    assert (g.context.trace_id, g.parent.span_id) == (trace, root)
    assert (g.start_time, g.end_time) == (T0 + 2000, T0 + 11000)
    a = g.attributes
    assert (a["nccl.gpu.duration_ns"], a["nccl.gpu.skew_ns"], a["nccl.gpu.late.rank"]) == (9000, 5000, 2)
    assert (a["nccl.gpu.late.queue_ns"], a["nccl.gpu.late.cause"], a["nccl.algo"]) == (6000, "gpu_queue", "RING")
    # now rank 1's host call came last (its queue is as short as the others'): it arrived late
    join.consume([gpu_span(10, r, 2000 if r != 1 else 8000, 1000, 1000) for r in range(4)])
    (g,) = [s for s in spans(sink.take()) if s.name == "nccl AllReduce gpu"]
    assert (g.attributes["nccl.gpu.late.rank"], g.attributes["nccl.gpu.late.cause"]) == (1, "host")
    # rank 3's host call returned last, 500 after the others' kernels started, but its stream then held its
    # kernel 5000 more: most of its lead (5500) was the stream's (hosts in step, one GPU behind)
    join.consume([gpu_span(11, r, 2000 if r != 3 else 7500, 1000, 1000 if r != 3 else 5000) for r in range(4)])
    (g,) = [s for s in spans(sink.take()) if s.name == "nccl AllReduce gpu"]
    assert (g.attributes["nccl.gpu.late.rank"], g.attributes["nccl.gpu.late.cause"]) == (3, "gpu_queue")
    # the same lead, 4000 of it its host call's lateness and 1500 its queue: it arrived late
    join.consume([gpu_span(12, r, 2000 if r != 3 else 7500, 1000, 1000 if r != 3 else 1500) for r in range(4)])
    (g,) = [s for s in spans(sink.take()) if s.name == "nccl AllReduce gpu"]
    assert (g.attributes["nccl.gpu.late.rank"], g.attributes["nccl.gpu.late.cause"]) == (3, "host")


def test_a_gpu_span_missing_ranks_is_released_partial_at_timeout(sink, clock):
    join = make(sink, clock, timeout=5.0)
    join.consume([gpu_span(11, r, 100, 100, 10) for r in (0, 3)])
    assert [s.name for s in spans(sink.take())] == ["ncclAllReduce gpu"] * 2
    clock.t = 6.0
    join.consume([])
    out = sink.take()
    (g,) = [s for s in spans(out) if s.name == "nccl AllReduce gpu"]
    assert g.attributes["nccl.partial"] is True and g.attributes["nccl.missing_ranks"] == (1, 2)
    assert metric(out, "nccl.join.gpu.released", outcome="partial") == 1
