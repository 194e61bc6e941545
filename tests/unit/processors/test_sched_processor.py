"""otel_ebpf/processors/sched: scheduler stats -> metrics (process spans are the lifecycle processor's)."""
from __future__ import annotations

from otel_ebpf.core.events import MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.sched import Config, SchedProcessor, factory
from otel_ebpf.processors.sched.processor import bucket_value
from otel_ebpf.receivers.sched.events import SchedCpuStats, SchedProcStats

T = 1_700_000_000_000_000_000


def make(**cfg) -> tuple[SchedProcessor, ListConsumer, Context]:
    sink, ctx = ListConsumer(), Context()
    return SchedProcessor(Config(**cfg), ctx, sink), sink, ctx


def metrics(events, name: str) -> list[MetricRecord]:
    return [e for e in events if isinstance(e, MetricRecord) and e.name == name]


def test_proc_stats_become_semconv_and_sched_metrics() -> None:
    proc, sink, _ = make()
    proc.consume([SchedProcStats(5, T, 2_000_000_000, (100, 0, 300, 0), 50, 7, 2, ((10, 3), (20, 1)))])
    out = sink.take()
    (cpu,) = metrics(out, "process.cpu.time")
    assert (cpu.pid, cpu.kind, cpu.unit, cpu.value) == (5, "counter", "s", 2.0)
    off = {m.attributes["process.sched.off_cpu.reason"]: m.value for m in metrics(out, "process.sched.off_cpu.time")}
    assert off == {"sleep": 100e-9, "lock": 300e-9}
    assert [m.value for m in metrics(out, "process.sched.runq.time")] == [50e-9]
    cs = {m.attributes["process.context_switch.type"]: m.value for m in metrics(out, "process.context_switches")}
    assert cs == {"voluntary": 7, "involuntary": 2}
    hist = {(m.value, m.count) for m in metrics(out, "process.sched.runq.latency")}
    assert hist == {(bucket_value(10), 3), (bucket_value(20), 1)}
    assert all(m.kind == "histogram" and m.unit == "s" for m in metrics(out, "process.sched.runq.latency"))
    assert 2 ** 10 <= bucket_value(10) * 1e9 < 2 ** 11


def test_cpu_stats_per_core() -> None:
    proc, sink, _ = make()
    proc.consume([SchedCpuStats(5, 1, T, 250_000_000), SchedCpuStats(5, 0, T, 0)])
    (m,) = metrics(sink.take(), "process.sched.cpu.time")
    assert (m.value, dict(m.attributes)) == (0.25, {"cpu.logical_number": 1})


def test_no_spans_and_other_events_pass_unchanged() -> None:
    """The process spans moved to the lifecycle processor: an exit passes through without one."""
    proc, sink, _ = make()
    other, exit_ = object(), ProcessExit(30, T + 1, "sh", -1, source="sched")
    proc.consume([other, exit_])
    out = sink.take()
    assert out == [other, exit_] and not [e for e in out if isinstance(e, SpanRecord)]
    proc.shutdown()
    proc.shutdown()
    assert sink.take() == []
    assert factory.type == "sched" and not factory.default_on
