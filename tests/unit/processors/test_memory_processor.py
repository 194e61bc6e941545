"""The memory processor fed by an in-memory sink: faults, RSS as up-down deltas, OOM spans."""
from __future__ import annotations

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.events import MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.memory import Config as ProcessorConfig
from otel_ebpf.processors.memory import MemoryProcessor
from otel_ebpf.receivers.memory import Config
from otel_ebpf.receivers.memory.events import MemoryUsage, OomKill, PageFaults
from otel_ebpf.core.telemetry import DROPPED


def _proc(**cfg: object) -> tuple[MemoryProcessor, ListConsumer, Context]:
    sink, ctx = ListConsumer(), Context()
    return MemoryProcessor(build(ProcessorConfig, cfg), ctx, sink), sink, ctx


def _values(events: list[object], name: str) -> list[float]:
    return [m.value for m in events if isinstance(m, MetricRecord) and m.name == name]


def test_rss_readings_become_deltas_that_sum_to_the_last_reading_and_to_zero_at_exit() -> None:
    p, sink, _ = _proc()
    p.consume([MemoryUsage(9, 100, 1000, 1), MemoryUsage(9, 100, 1000, 2), MemoryUsage(9, 40, 1200, 3)])
    assert _values(sink.events, "process.memory.usage") == [100, -60]
    assert _values(sink.events, "process.memory.virtual") == [1000, 200]
    p.consume([ProcessExit(9, 4, "x", 0, source="cuda")])  # another receiver's exit: not ours
    assert sum(_values(sink.events, "process.memory.usage")) == 40
    p.consume([ProcessExit(9, 5, "x", 0, source="memory")])
    assert sum(_values(sink.events, "process.memory.usage")) == 0
    assert sum(_values(sink.events, "process.memory.virtual")) == 0
    assert isinstance(sink.events[-1], ProcessExit)  # passed on


def test_page_faults_are_a_counter_on_the_process() -> None:
    p, sink, _ = _proc()
    p.consume([PageFaults(3, 250, 1)])
    (m,) = sink.events
    assert isinstance(m, MetricRecord)
    assert (m.pid, m.name, m.kind, m.value, m.unit) == (3, "process.paging.faults", "counter", 250, "{fault}")


def test_oom_kill_is_a_span_naming_the_victim(caplog: pytest.LogCaptureFixture) -> None:
    p, sink, _ = _proc()
    p.consume([OomKill(51, "trainer", 777, 1 << 30, 64 << 20, 1 << 20, 0, 1000, 0, 52)])
    span = next(e for e in sink.events if isinstance(e, SpanRecord))
    assert (span.pid, span.name, span.start_ns, span.end_ns, span.error, span.comm) == (
        51, "process.oom_kill", 777, 777, "oom_kill", "trainer")
    assert span.attributes["process.oom.anon_rss"] == 64 << 20
    assert span.attributes["process.oom.trigger_pid"] == 52
    assert _values(sink.events, "process.oom_kills") == [1]
    assert "pid 51 (trainer)" in caplog.text


def test_the_usage_table_is_bounded_and_its_drops_counted() -> None:
    p, _, ctx = _proc(max_processes=2)
    p.consume([MemoryUsage(pid, 1, 1, 1) for pid in (1, 2, 3)])
    assert ctx.telemetry.get(DROPPED, receiver="memory", reason="usage_table_full") == 1


@pytest.mark.parametrize(("data", "key"), [
    ({"ringbuf_pages": 3}, "receivers.memory.ringbuf_pages"),
    ({"max_processes": 0}, "receivers.memory.max_processes"),
    ({"interval": 0.001}, "receivers.memory.interval"),
])
def test_receiver_config_errors_name_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build(Config, data, "receivers.memory")
    assert err.value.path == key
