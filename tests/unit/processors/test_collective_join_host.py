"""otel_ebpf/processors/collective_join + nccl: the straggler's host figures ("why was it late") on the
collective's root span, next to the median of the other ranks."""
from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.core.readable import with_changes
from otel_ebpf.host.timeline import HostStats
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.collective_join import CollectiveJoin, Config
from tests.support import nccl_spans

T0 = 1_700_000_000_000_000_000
OFF_CPU = {0: 0.002, 1: 0.001, 2: 0.003, 3: 0.180}


def _rank(seq: int, rank: int, start: int, **step: float) -> ReadableSpan:
    span = nccl_spans.rank_span(seq, rank, T0 + start)
    attrs = dict(span.attributes or {})
    attrs.update(step)
    return with_changes(span, attrs)


def test_root_span_carries_the_stragglers_off_cpu_time_and_the_peers_median() -> None:
    sink = ListConsumer()
    join = CollectiveJoin(Config(), Context(), sink, clock=lambda: 0.0, wall_ns=lambda: T0)
    # rank 3 starts last: it was off-CPU 180 ms in the step before
    join.consume([_rank(1, r, 1_000 * r, **{"ml.step.off_cpu.duration": OFF_CPU[r], "ml.step.page_faults": r})
                  for r in range(4)])
    (root,) = [s for s in sink.take() if isinstance(s, ReadableSpan) and s.parent is None]
    a = root.attributes
    assert a["nccl.straggler.rank"] == 3
    assert a["nccl.straggler.off_cpu.duration"] == 0.180
    assert a["nccl.peers_median.off_cpu.duration"] == 0.002
    assert a["nccl.straggler.page_faults"] == 3 and a["nccl.peers_median.page_faults"] == 1


def test_no_host_figures_no_extra_attributes() -> None:
    sink = ListConsumer()
    join = CollectiveJoin(Config(), Context(), sink, clock=lambda: 0.0, wall_ns=lambda: T0)
    join.consume([_rank(2, r, 1_000 * r) for r in range(4)])
    (root,) = [s for s in sink.take() if isinstance(s, ReadableSpan) and s.parent is None]
    assert not [k for k in root.attributes if k.startswith(("nccl.straggler.off", "nccl.peers_median"))]


def test_nccl_processor_puts_the_step_figures_of_the_calling_thread_on_each_collective() -> None:
    from otel_ebpf.core.events import SpanRecord
    from otel_ebpf.processors.nccl import Config as NcclConfig
    from otel_ebpf.processors.nccl.processor import NcclProcessor
    from otel_ebpf.receivers.nccl.events import NcclCollective, NcclCommInit

    ctx, sink = Context(), ListConsumer()
    ctx.host_stats = HostStats(ctx.telemetry)
    proc = NcclProcessor(NcclConfig(host="h"), ctx, sink)
    ms = 1_000_000
    # thread 41 of process 40: asleep 180 ms between t=20 ms and t=200 ms
    for t, sleep in ((0, 0), (20, 0), (200, 180), (400, 180)):
        ctx.host_stats.add(40, T0 + t * ms, tid=41, off_cpu_sleep_ns=sleep * ms, off_cpu_io_ns=0,
                           off_cpu_lock_ns=0, off_cpu_other_ns=0, runq_ns=0, on_cpu_ns=0)

    def coll(seq: int, start_ms: int) -> NcclCollective:
        return NcclCollective(40, 41, T0 + start_ms * ms, T0 + (start_ms + 1) * ms, "AllReduce", 0x50, 8, 7, 0,
                              None, 0, seq, 0, 0)

    proc.consume([NcclCommInit(40, 41, T0, T0 + 1, "ncclCommInitRank", 0x50, 2, 1, b"u" * 128, 0),
                  coll(0, 10), coll(1, 300)])
    first, second = [s for s in sink.take() if isinstance(s, SpanRecord) and s.name == "ncclAllReduce"]
    assert "ml.step.off_cpu.duration" not in first.attributes  # no previous collective
    assert second.attributes["ml.step.off_cpu.duration"] == 0.180  # [11 ms, 300 ms]
    assert second.attributes["ml.step.interval.duration"] == 0.289
    assert ctx.host_stats.watched() == [(40, 41)]
