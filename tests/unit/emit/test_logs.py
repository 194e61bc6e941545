"""otel_ebpf.emit.logs and the Emitter's log signal: LogRecord -> SDK ReadableLogRecord on the
resource that pid's spans get, through each exporter's own bounded log queue, every drop counted."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_ebpf.core.events import LogRecord, SpanRecord
from otel_ebpf.core.telemetry import DROPPED, Telemetry
from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.emit.exporters import (
    FileExporterConfig,
    OtlpExporterConfig,
    PrometheusExporterConfig,
    build_log_exporter,
)
from otel_ebpf.emit.jsonfile import JsonLinesLogExporter
from otel_ebpf.emit.logs import SEVERITY_NUMBERS, LogBuilder
from tests.unit.emit.test_emitter import StoringMetricExporter, resource_of

T0 = 1_700_000_000_000_000_000
TRACE = 0x0123456789ABCDEF0123456789ABCDEF
SPAN = 0x1122334455667788


def log(pid: int | None = 10, **kw: Any) -> LogRecord:
    kw.setdefault("time_ns", T0)
    kw.setdefault("event_name", "otel_ebpf.nccl.rank.stack")
    kw.setdefault("body", 'File "train.py", line 42, in step\n  dist.all_reduce(t)')
    kw.setdefault("attributes", {"nccl.rank": 3, "nccl.comm.id": "00ff", "ranks": (1, 2)})
    return LogRecord(pid=pid, **kw)


class LogRig:
    """An Emitter with one in-memory exporter for each signal."""

    def __init__(self, logs: LogRecordExporter | None = None, **spec: Any) -> None:
        self.spans = InMemorySpanExporter()
        self.logs = logs if logs is not None else InMemoryLogRecordExporter()
        self.telemetry = Telemetry()
        spec.setdefault("batch_delay", 0.02)
        self.emitter = Emitter([ExporterSpec("mem", self.spans, StoringMetricExporter(), logs=self.logs, **spec)],
                               self.telemetry, resource_of=resource_of,
                               agent_attributes={"service.name": "otel-ebpf"}, metrics_interval=3600.0)

    def finished(self) -> list[ReadableLogRecord]:
        assert self.emitter.flush(5.0)
        assert isinstance(self.logs, InMemoryLogRecordExporter)
        return list(self.logs.get_finished_logs())


@pytest.fixture
def rig():
    r = LogRig()
    yield r
    r.emitter.shutdown()


def test_a_log_record_carries_its_process_resource_scope_event_name_severity_body_attributes_and_ids(rig):
    rig.emitter.consume([SpanRecord(pid=10, name="ncclAllReduce", start_ns=T0, end_ns=T0 + 5, attributes={}),
                         log(severity="WARN", scope="otel_ebpf.hang", trace_id=TRACE, span_id=SPAN, comm="python")])
    (rec,) = rig.finished()
    (span,) = rig.spans.get_finished_spans()
    assert rec.resource is span.resource  # exactly the resource the pid's spans get
    assert rec.resource.attributes["process.pid"] == 10 and rec.resource.attributes["service.name"] == "svc-10"
    assert rec.instrumentation_scope is not None and rec.instrumentation_scope.name == "otel_ebpf.hang"
    r = rec.log_record
    assert (r.event_name, r.severity_text, r.severity_number) == ("otel_ebpf.nccl.rank.stack", "WARN",
                                                                  SeverityNumber.WARN)
    assert r.body == 'File "train.py", line 42, in step\n  dist.all_reduce(t)'
    assert dict(r.attributes or {}) == {"nccl.rank": 3, "nccl.comm.id": "00ff", "ranks": (1, 2)}
    assert (r.trace_id, r.span_id, r.trace_flags) == (TRACE, SPAN, TraceFlags.SAMPLED)
    assert r.timestamp == T0 and r.observed_timestamp >= T0
    assert rig.emitter.logs_emitted == 1


def test_a_log_of_no_process_is_on_the_agent_resource_and_new_pids_get_theirs(rig):
    rig.emitter.consume([log(pid=None, event_name="otel_ebpf.nccl.straggler"), log(pid=77, comm="torchrun")])
    agent, proc = rig.finished()
    assert agent.resource.attributes["service.name"] == "otel-ebpf" and "process.pid" not in agent.resource.attributes
    assert proc.resource.attributes["process.pid"] == 77
    assert proc.resource.attributes["process.executable.name"] == "torchrun"
    assert rig.emitter.process_count() == 1


def test_without_ids_a_log_has_none_even_under_a_current_span(rig):
    current = NonRecordingSpan(SpanContext(TRACE, SPAN, is_remote=False, trace_flags=TraceFlags(1)))
    with trace_api.use_span(current):
        rig.emitter.consume([log()])
    (rec,) = rig.finished()
    assert (rec.log_record.trace_id, rec.log_record.span_id, rec.log_record.trace_flags) == (0, 0, 0)


@pytest.mark.parametrize("severity", list(SEVERITY_NUMBERS))
def test_every_severity_text_gets_its_otel_number(severity):
    rec = LogBuilder().build(log(severity=severity), resource=None)  # type: ignore[arg-type]
    assert rec.log_record.severity_text == severity
    assert rec.log_record.severity_number is SeverityNumber[severity]


def test_a_bad_record_is_counted_and_the_others_go_out(rig):
    rig.emitter.consume([log(severity="LOUD"), log(trace_id=1 << 128), log(body="ok")])  # type: ignore[arg-type]
    assert [r.log_record.body for r in rig.finished()] == ["ok"]
    assert rig.telemetry.get(DROPPED, receiver="emit", reason="bad_record") == 2


class BlockingLogExporter(LogRecordExporter):
    """Holds every export until ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.exported = 0

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        self.started.set()
        self.release.wait(10)
        self.exported += len(batch)
        return LogRecordExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_a_full_log_queue_drops_new_records_and_counts_them_apart_from_spans():
    stuck = BlockingLogExporter()
    rig = LogRig(stuck, queue_size=4, batch_size=2)
    try:
        rig.emitter.consume([log(body="first")])
        assert stuck.started.wait(5)  # one record in flight holds one slot of 4
        rig.emitter.consume([log(body=str(i)) for i in range(6)])  # 3 fit
        assert rig.telemetry.get(DROPPED, receiver="mem", reason="export_queue_full", signal="logs") == 3
        rig.emitter.consume([SpanRecord(pid=10, name="s", start_ns=T0, end_ns=T0, attributes={})])
        assert rig.emitter.span_queues[0].flush(5.0) and len(rig.spans.get_finished_spans()) == 1
        assert rig.telemetry.get(DROPPED) == 3  # in the drop total (the run summary's), spans lost none
        gauges = {(p.attributes["signal"], m.name): p.value
                  for rm in rig.emitter.collect().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                  if m.name.startswith("otel_ebpf.exporter.queue") for p in m.data.data_points}
        assert gauges[("logs", "otel_ebpf.exporter.queue.capacity")] == 4
        assert gauges[("logs", "otel_ebpf.exporter.queue.size")] == 4
        stuck.release.set()
        assert rig.emitter.flush(5.0) and stuck.exported == 4
    finally:
        stuck.release.set()
        rig.emitter.shutdown()


def test_log_records_still_queued_at_the_shutdown_deadline_are_counted():
    stuck = BlockingLogExporter()
    rig = LogRig(stuck, queue_size=10, batch_size=1)
    rig.emitter.consume([log(body=str(i)) for i in range(3)])
    assert stuck.started.wait(5)
    rig.emitter.shutdown(deadline=0.0)  # already passed: the wire is shut (which releases the export)
    lost = rig.telemetry.get(DROPPED, receiver="mem", reason="export_shutdown", signal="logs")
    assert lost + stuck.exported == 3 and lost >= 2


def test_an_exporter_without_logs_gets_no_log_queue_and_nothing_is_counted():
    tel = Telemetry()
    emitter = Emitter([ExporterSpec("prom", InMemorySpanExporter(), StoringMetricExporter())], tel,
                      resource_of=resource_of, agent_attributes={}, metrics_interval=3600.0)
    try:
        emitter.consume([log()])
        assert emitter.log_queues == [] and emitter.logs_emitted == 1 and tel.get(DROPPED) == 0
    finally:
        emitter.shutdown()


def test_each_exporter_config_builds_its_log_exporter(tmp_path):
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogs
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogs

    assert isinstance(build_log_exporter(FileExporterConfig(directory=str(tmp_path))), JsonLinesLogExporter)
    assert build_log_exporter(PrometheusExporterConfig()) is None
    grpc = build_log_exporter(OtlpExporterConfig(endpoint="http://127.0.0.1:4999", timeout=3.0))
    assert isinstance(grpc, GrpcLogs) and grpc._timeout == 3.0
    http = build_log_exporter(OtlpExporterConfig(endpoint="http://127.0.0.1:4999/", protocol="http",
                                                 headers={"authorization": "x"}))
    assert isinstance(http, HttpLogs) and http._endpoint == "http://127.0.0.1:4999/v1/logs"
    for exporter in (grpc, http):
        exporter.shutdown()
