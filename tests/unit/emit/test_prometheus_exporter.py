"""otel_ebpf.emit.prometheus: the emitter's merged MetricsData served as a Prometheus page."""
from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_ebpf.core.config import build
from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.emit.exporters import PrometheusExporterConfig, build_exporters
from otel_ebpf.emit.prometheus import NoSpanExporter, PrometheusMetricExporter
from otel_ebpf.core.errors import ConfigError, OtelEbpfError
from otel_ebpf.core.events import MetricRecord
from otel_ebpf.core.telemetry import Telemetry


def samples(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


@pytest.fixture
def served():
    exporter = PrometheusMetricExporter("127.0.0.1", 0)
    emitter = Emitter([ExporterSpec("prometheus", NoSpanExporter(), exporter)], Telemetry(),
                      resource_of=lambda pid, comm: {"process.pid": pid, "service.name": "train", "ml.rank": 3,
                                                     "process.command_line": "python train.py --token=x"},
                      agent_attributes={"service.name": "otel-ebpf", "host.name": "node1"})
    yield emitter, exporter
    emitter.shutdown()
    exporter.shutdown()  # safe twice


def test_series_of_many_resources_keep_their_own_labels(served) -> None:
    emitter, exporter = served
    gpu = {"hw.id": "GPU-1"}
    emitter.consume([MetricRecord(None, "hw.gpu.memory.usage", "updown", 100, gpu, unit="By"),
                     MetricRecord(42, "hw.gpu.memory.usage", "updown", 7, gpu, unit="By"),
                     MetricRecord(None, "hw.errors", "counter", 2, {**gpu, "error.type": "xid_79"}, unit="{error}"),
                     MetricRecord(42, "otel_ebpf.nvml.scrape.duration", "histogram", 0.5, gpu, unit="s", count=3)])
    assert samples(exporter.port) == {}  # nothing exported yet
    emitter.flush()
    page = samples(exporter.port)
    usage = sorted(page["hw_gpu_memory_usage_bytes"], key=lambda s: s[1])
    # The agent's series has no process_pid/ml_rank (absent, not shifted from the process's columns).
    assert [(lb.get("process_pid") or None, lb.get("ml_rank") or None, lb["service_name"], lb["hw_id"], v)
            for lb, v in usage] == [("42", "3", "train", "GPU-1", 7.0), (None, None, "otel-ebpf", "GPU-1", 100.0)]
    assert all("process_command_line" not in lb and "host_name" not in lb for lb, _ in usage)  # not selected
    [(labels, value)] = page["hw_errors_total"]
    assert (labels["error_type"], value) == ("xid_79", 2.0)
    [(labels, count)] = page["otel_ebpf_nvml_scrape_duration_seconds_count"]
    assert count == 3.0 and {k: v for k, v in labels.items() if v} == {
        "hw_id": "GPU-1", "otel_scope_name": "otel_ebpf", "process_pid": "42", "service_name": "train", "ml_rank": "3"}
    assert samples(exporter.port) == page  # served again on every scrape until the next export
    text = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=5).read().decode()
    assert '=""' not in text  # a label a point lacks is left out, not printed empty (issue 18)


def test_config_is_loopback_unless_allowed() -> None:
    assert build(PrometheusExporterConfig, {}).host_port() == ("127.0.0.1", 9435)
    assert build(PrometheusExporterConfig, {"endpoint": "[::1]:9100"}).host_port() == ("::1", 9100)
    with pytest.raises(ConfigError) as info:
        build(PrometheusExporterConfig, {"endpoint": "0.0.0.0:9435"}, "exporters.prometheus")
    assert "exporters.prometheus.endpoint" in str(info.value) and "allow_non_loopback" in str(info.value)
    assert build(PrometheusExporterConfig, {"endpoint": "0.0.0.0:9435", "allow_non_loopback": True})
    with pytest.raises(ConfigError):
        build(PrometheusExporterConfig, {"endpoint": "9435"})


def test_a_taken_port_is_named() -> None:
    first = PrometheusMetricExporter("127.0.0.1", 0)
    try:
        cfg = build(PrometheusExporterConfig, {"endpoint": f"127.0.0.1:{first.port}"})
        with pytest.raises(OtelEbpfError) as info:
            build_exporters(cfg)
        assert f"127.0.0.1:{first.port}" in str(info.value) and "exporters.prometheus.endpoint" in str(info.value)
    finally:
        first.shutdown()
