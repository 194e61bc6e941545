"""Spans of a batch the exporter could not send are counted, not lost silently (the SDK's
BatchSpanProcessor ignores export results): ``otel_ebpf.events.dropped{reason=export_failed}``."""
from __future__ import annotations

from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.events import SpanRecord
from otel_ebpf.telemetry import DROPPED, Telemetry
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
    tel = Telemetry()
    exporter = Flaky(how)
    emitter = Emitter([ExporterSpec("otlp", exporter, EncodingMetricExporter(), queue_size=1000, batch_size=10,
                                    batch_delay=0.05)], tel, resource_of=lambda pid, comm: {"process.pid": pid},
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
