"""The blockio processor fed by an in-memory sink, and the block IO configs' errors."""
from __future__ import annotations

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.events import MetricRecord, Tick
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.blockio import BlockIoProcessor
from otel_ebpf.processors.blockio import Config as ProcessorConfig
from otel_ebpf.processors.blockio.processor import bucket_seconds
from otel_ebpf.receivers.blockio import Config
from otel_ebpf.receivers.blockio.events import DiskIoStats, ProcessDiskIo


def _run(events: list[object], **cfg: object) -> list[object]:
    sink = ListConsumer()
    BlockIoProcessor(build(ProcessorConfig, cfg), Context(), sink).consume(events)
    return sink.events


def _by_name(out: list[object], name: str) -> list[MetricRecord]:
    return [m for m in out if isinstance(m, MetricRecord) and m.name == name]


def test_device_stats_become_semconv_counters_and_a_latency_histogram() -> None:
    ev = DiskIoStats("vda", "write", 5, 5 * 4096, 2_500_000, ((0, 1), (7, 3), (10, 1)), 1)
    out = _run([ev])
    attrs = {"system.device": "vda", "disk.io.direction": "write"}
    assert [(m.pid, m.value, dict(m.attributes), m.unit) for m in _by_name(out, "system.disk.io")] == [
        (None, 5 * 4096, attrs, "By")]
    assert _by_name(out, "system.disk.operations")[0].value == 5
    assert _by_name(out, "system.disk.operation_time")[0].value == pytest.approx(0.0025)
    hist = _by_name(out, "system.disk.operation.duration")
    assert [(m.kind, m.value, m.count) for m in hist] == [
        ("histogram", 0.5e-6, 1), ("histogram", 96e-6, 3), ("histogram", 768e-6, 1)]
    assert sum(m.count for m in hist) == ev.ops


def test_bucket_midpoints_lie_inside_their_log2_bucket() -> None:
    for slot in range(1, 32):
        lo, hi = (1 << (slot - 1)) * 1e-6, (1 << slot) * 1e-6
        assert lo <= bucket_seconds(slot) < hi


def test_operations_other_than_read_and_write_carry_no_direction() -> None:
    out = _run([DiskIoStats("vda", "flush", 2, 0, 10, ((3, 2),), 1)])
    for m in out:
        assert isinstance(m, MetricRecord)
        assert "disk.io.direction" not in m.attributes and m.attributes["disk.io.operation"] == "flush"


def test_process_io_goes_on_the_process_resource_and_histogram_can_be_off() -> None:
    out = _run([ProcessDiskIo(77, "loop3", "read", 2, 8192, 4000, 1),
                DiskIoStats("loop3", "read", 2, 8192, 4000, ((3, 2),), 1)], latency_histogram=False)
    io = _by_name(out, "process.disk.io")
    assert [(m.pid, m.value, m.attributes["disk.io.direction"]) for m in io] == [(77, 8192, "read")]
    assert _by_name(out, "process.disk.operations")[0].value == 2
    assert _by_name(out, "process.disk.operation_time")[0].value == pytest.approx(4e-6)
    assert not _by_name(out, "system.disk.operation.duration")


def test_other_events_pass_unchanged() -> None:
    tick = Tick(5)
    assert _run([tick]) == [tick]


@pytest.mark.parametrize(("data", "key"), [
    ({"interval": "1ms"}, "receivers.blockio.interval"),
    ({"max_inflight": 0}, "receivers.blockio.max_inflight"),
    ({"max_devices": -1}, "receivers.blockio.max_devices"),
    ({"latency": True}, "receivers.blockio.latency"),
])
def test_receiver_config_errors_name_the_key(data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build(Config, data, "receivers.blockio")
    assert err.value.path == key
