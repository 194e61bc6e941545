"""Spans of a batch the exporter could not send are counted, not lost silently:
``otel_ebpf.events.dropped{reason=export_failed}`` once retries are off or run out;
and while the collector is down, gRPC keeps trying to reconnect at a bounded interval
(``exporters.otlp.reconnect_backoff_max``), so export resumes soon after it is back."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from itertools import pairwise

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.emit.exporters import OtlpExporterConfig, RetryConfig, build_exporters
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.events import SpanRecord
from otel_ebpf.core.telemetry import DROPPED, Telemetry
from tests.fuzz.test_fuzz_processors import EncodingMetricExporter


class Flaky(SpanExporter):
    """Fails (by result or by raising) while ``down``; counts what it accepted."""

    def __init__(self, how: str) -> None:
        self.down, self.how, self.accepted = True, how, 0

    def export(self, spans: Sequence) -> SpanExportResult:
        if self.down:
            if self.how == "raise":
                raise ConnectionError("collector down")
            return SpanExportResult.FAILURE
        self.accepted += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize("how", ["result", "raise"])
def test_failed_span_exports_are_counted_and_later_ones_delivered(how):
    """Without retries (``retry_on_failure.enabled: false``) a failed batch is counted at once."""
    tel = Telemetry()
    exporter = Flaky(how)
    emitter = Emitter([ExporterSpec("otlp", exporter, EncodingMetricExporter(), queue_size=1000, batch_size=10,
                                    batch_delay=0.05, retry=RetryConfig(enabled=False))], tel,
                      resource_of=lambda pid, comm: {"process.pid": pid},
                      agent_attributes={"service.name": "otel-ebpf"}, metrics_interval=3600)
    rec = SpanRecord(pid=7, name="cudaMemcpy", start_ns=1, end_ns=2, attributes={})
    try:
        emitter.consume([rec] * 25)
        emitter.flush()
        assert tel.get(DROPPED, receiver="otlp", reason="export_failed") == 25
        assert tel.get("otel_ebpf.export.failed", signal="spans") == 3  # batches of 10, 10, 5
        exporter.down = False
        emitter.consume([rec] * 5)
        emitter.flush()
        assert exporter.accepted == 5 and tel.get(DROPPED, reason="export_failed") == 25
    finally:
        emitter.shutdown()


def test_otlp_reconnect_backoff_max_is_a_validated_config_key(tmp_path):
    from otel_ebpf.service import settings
    def load(value):
        path = tmp_path / "agent.yaml"
        path.write_text(f"exporters:\n  otlp:\n    reconnect_backoff_max: {value}\n")
        path.chmod(0o600)
        return settings.load(str(path), endpoint="http://127.0.0.1:4317")

    assert OtlpExporterConfig().reconnect_backoff_max == 5.0
    cfg = load("2s").exporters["otlp"]
    assert cfg.reconnect_backoff_max == 2.0
    assert dict(cfg.channel_options()) == {"grpc.initial_reconnect_backoff_ms": 1000,
                                           "grpc.max_reconnect_backoff_ms": 2000}
    assert dict(OtlpExporterConfig(reconnect_backoff_max=0.5).channel_options())[
        "grpc.initial_reconnect_backoff_ms"] == 500  # grpc wants initial <= max
    for bad in ("0s", "10m"):
        with pytest.raises(ConfigError) as info:
            load(bad)
        assert info.value.path == "exporters.otlp.reconnect_backoff_max"


class _RefusingCollector:
    """A TCP listener that accepts and closes every connection at once: to gRPC each accept is
    one failed connection attempt, timed here."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.attempts: list[float] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.attempts.append(time.monotonic())
            conn.close()

    def close(self) -> None:
        self._sock.close()


def test_grpc_reconnect_attempts_stay_bounded_while_the_collector_is_down():
    """Issue 7 (recovery stall): the span and metric exporters open channels to the same target with
    the same arguments, so grpc shares one subchannel between them and its reconnect backoff
    (grpc default: x1.6 per failure up to 120 s) keeps growing across the SDK's channel
    re-creations: measured 22-29 s between attempts after a 60 s outage. With
    ``reconnect_backoff_max: 1s`` the attempts must stay about 1 s (+20 % jitter) apart."""
    collector = _RefusingCollector()
    spans, metrics = build_exporters(OtlpExporterConfig(endpoint=f"127.0.0.1:{collector.port}",
                                                        reconnect_backoff_max=1.0))
    span = TracerProvider().get_tracer("t").start_span("cudaMemcpy")
    span.end()
    reader = InMemoryMetricReader()
    MeterProvider(metric_readers=[reader]).get_meter("t").create_counter("calls").add(1)
    data = reader.get_metrics_data()
    assert data is not None
    stop = time.monotonic() + 15  # the grpc default backoff passes 2.5 s within ~5 s, 4 s within ~9 s

    def export_metrics() -> None:  # the agent's metrics timer: every 2 s, its own retries
        while time.monotonic() < stop:
            metrics.export(data, timeout_millis=10_000)
            time.sleep(2)

    thread = threading.Thread(target=export_metrics, daemon=True)
    thread.start()
    try:
        while time.monotonic() < stop:
            assert spans.export([span]) == SpanExportResult.FAILURE
        thread.join(timeout=15)
    finally:
        spans.shutdown()
        metrics.shutdown()
        collector.close()
    attempts = list(collector.attempts)
    gaps = [b - a for a, b in pairwise(attempts)]
    assert len(gaps) >= 6, attempts
    assert max(gaps) <= 2.5, [round(g, 1) for g in gaps]  # 1 s + jitter, 2x margin for the shared CPUs
