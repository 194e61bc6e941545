"""The perf processor fed by an in-memory sink, and the perf receiver's config errors."""
from __future__ import annotations

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.events import MetricRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.perf import Config as ProcessorConfig
from otel_ebpf.processors.perf import PerfProcessor
from otel_ebpf.receivers.perf import Config
from otel_ebpf.receivers.perf.events import PerfCount


def test_counts_become_counters_process_or_host_with_multiplexing_marked() -> None:
    sink = ListConsumer()
    PerfProcessor(ProcessorConfig(), Context(), sink).consume([
        PerfCount(5, "cycles", 1000, False, 1), PerfCount(5, "task_clock", 2_000_000, True, 1),
        PerfCount(None, "instructions", 7, False, 1), "other"])
    got = [(m.pid, m.name, m.value, m.unit, dict(m.attributes)) for m in sink.events if isinstance(m, MetricRecord)]
    assert got == [(5, "process.cpu.cycles", 1000, "{cycle}", {}),
                   (5, "process.cpu.task_clock", pytest.approx(0.002), "s", {"perf.multiplexed": True}),
                   (None, "system.cpu.instructions", 7, "{instruction}", {})]
    assert sink.events[-1] == "other"


@pytest.mark.parametrize(("data", "key"), [
    ({"events": ["cycles", "branch_misses"]}, "receivers.perf.events[1]"),
    ({"events": ["cycles", "cycles"]}, "receivers.perf.events"),
    ({"max_processes": 0}, "receivers.perf.max_processes"),
])
def test_receiver_config_errors_name_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build(Config, data, "receivers.perf")
    assert err.value.path == key
