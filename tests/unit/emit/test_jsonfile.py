"""otel_ebpf.emit.jsonfile: OTLP/JSON lines, as the Collector's file exporter writes them."""
from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs.export import LogRecordExportResult
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from otel_ebpf.core.errors import ConfigError
from otel_ebpf.emit.exporters import FileExporterConfig, OtlpExporterConfig, check_output_directory
from otel_ebpf.core.events import LogRecord
from otel_ebpf.emit.jsonfile import JsonLinesLogExporter, JsonLinesMetricExporter, JsonLinesSpanExporter
from otel_ebpf.emit.logs import LogBuilder
from otel_ebpf.receivers.otlp import parse_otlp_json
from otel_ebpf.receivers.otlp import to_otlp_json as receiver_to_otlp_json

ID_LENGTHS = {"traceId": 32, "spanId": 16, "parentSpanId": 16}
RESOURCE = Resource.create({"service.name": "train", "process.pid": 42})


def make_spans() -> list[ReadableSpan]:
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer("otel_ebpf.nccl")
    with tracer.start_as_current_span("step", kind=SpanKind.SERVER) as parent:
        child = tracer.start_span("ncclAllReduce", kind=SpanKind.CLIENT, start_time=10**18,
                                  attributes={"nccl.count": 1024, "nccl.op": "sum", "ok": True, "r": 0.5,
                                              "ranks": (0, 1)},
                                  links=[Link(parent.get_span_context(), {"why": "peer"})])
        child.add_event("enqueued", {"n": 1}, timestamp=10**18 + 5)
        child.set_status(Status(StatusCode.ERROR, "ncclSystemError"))
        child.end(end_time=10**18 + 100)
    provider.shutdown()
    return list(mem.get_finished_spans())


def make_metrics() -> MetricsData:
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=RESOURCE, metric_readers=[reader])
    meter = provider.get_meter("otel_ebpf.cuda")
    tracer_provider = TracerProvider()
    with tracer_provider.get_tracer("t").start_as_current_span("s"):  # exemplars carry hex ids too
        meter.create_counter("calls").add(3, {"fn": "cudaMalloc"})
        meter.create_histogram("lat", unit="s").record(0.25, {"fn": "cudaMalloc"})
    meter.create_gauge("mem", unit="By").set(7)
    meter.create_up_down_counter("inflight").add(-2)
    data = reader.get_metrics_data()
    provider.shutdown()
    assert data is not None
    return data


def make_logs() -> list[Any]:
    """Two SDK log records as the Emitter builds them: one tied to a span, one not, two scopes."""
    build = LogBuilder().build
    return [build(LogRecord(pid=42, time_ns=10**18, event_name="otel_ebpf.nccl.rank.stack", body="line 1\nline 2",
                            attributes={"nccl.rank": 3, "ranks": (1, 2), "ok": True}, severity="WARN",
                            scope="otel_ebpf.hang", trace_id=0x0123456789ABCDEF0123456789ABCDEF,
                            span_id=0x1122334455667788), RESOURCE),
            build(LogRecord(pid=None, time_ns=10**18 + 7, event_name="otel_ebpf.nccl.straggler", body="rank 3",
                            attributes={}, severity="ERROR"), RESOURCE)]


def hex_ids_to_base64(node: Any) -> Any:
    """The plain protobuf JSON mapping of an OTLP/JSON tree (ids base64, not hex), for json_format."""
    if isinstance(node, dict):
        return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in ID_LENGTHS else hex_ids_to_base64(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [hex_ids_to_base64(v) for v in node]
    return node


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield k, v
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def assert_otlp_json_shape(tree: dict) -> None:
    ids = [(k, v) for k, v in walk(tree) if k in ID_LENGTHS]
    assert ids, "expected trace/span ids in the output"
    for key, value in ids:
        assert re.fullmatch(f"[0-9a-f]{{{ID_LENGTHS[key]}}}", value), (key, value)
    for key, _ in walk(tree):
        assert re.fullmatch(r"[a-z][A-Za-z0-9]*", key), f"not lowerCamelCase: {key}"


def read_lines(path) -> list[str]:
    return path.read_text().splitlines()


def test_traces_line_is_otlp_json_and_round_trips(tmp_path):
    spans = make_spans()
    exporter = JsonLinesSpanExporter(tmp_path / "out")
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    (line,) = read_lines(tmp_path / "out" / "traces.jsonl")
    tree = json.loads(line)
    assert_otlp_json_shape(tree)
    assert {k for k, _ in walk(tree)} >= {"parentSpanId", "links", "events", "status", "resourceSpans"}
    span_kinds = [v for k, v in walk(tree) if k == "kind"]
    assert sorted(span_kinds) == [2, 3]  # enums as integers: SERVER, CLIENT
    assert parse_otlp_json(line, ExportTraceServiceRequest) == encode_spans(spans)


def test_metrics_line_is_otlp_json_and_round_trips(tmp_path):
    data = make_metrics()
    exporter = JsonLinesMetricExporter(tmp_path)
    assert exporter.export(data) is MetricExportResult.SUCCESS
    (line,) = read_lines(tmp_path / "metrics.jsonl")
    tree = json.loads(line)
    assert_otlp_json_shape(tree)  # exemplars hold traceId/spanId
    assert {k for k, _ in walk(tree)} >= {"resourceMetrics", "scopeMetrics", "dataPoints", "bucketCounts",
                                         "exemplars", "aggregationTemporality", "isMonotonic"}
    assert parse_otlp_json(line, ExportMetricsServiceRequest) == encode_metrics(data)


def test_logs_line_is_otlp_json_and_parses_back_with_the_proto_classes(tmp_path):
    logs = make_logs()
    exporter = JsonLinesLogExporter(tmp_path / "out")
    assert exporter.export(logs) is LogRecordExportResult.SUCCESS
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["logs.jsonl"]  # next to traces/metrics
    (line,) = read_lines(tmp_path / "out" / "logs.jsonl")
    tree = json.loads(line)
    assert_otlp_json_shape(tree)
    request = json_format.Parse(json.dumps(hex_ids_to_base64(tree)), ExportLogsServiceRequest())
    assert request == encode_logs(logs)
    (resource_logs,) = request.resource_logs
    by_scope = {sl.scope.name: list(sl.log_records) for sl in resource_logs.scope_logs}
    (stack,), (straggler,) = by_scope["otel_ebpf.hang"], by_scope["otel_ebpf"]
    assert (stack.event_name, stack.severity_text, stack.severity_number, stack.body.string_value) == \
        ("otel_ebpf.nccl.rank.stack", "WARN", 13, "line 1\nline 2")
    assert stack.trace_id.hex() == "0123456789abcdef0123456789abcdef" and stack.span_id.hex() == "1122334455667788"
    assert stack.flags == 1 and stack.time_unix_nano == 10**18
    assert (straggler.trace_id, straggler.span_id, straggler.flags, straggler.severity_number) == (b"", b"", 0, 17)


def test_logs_line_is_exactly_protobufs_json_of_the_sdk_encoding(tmp_path):
    """Golden: our line equals json_format's own rendering of encode_logs, ids spelled in hex."""
    logs = make_logs()
    JsonLinesLogExporter(tmp_path).export(logs)
    golden = json_format.MessageToDict(encode_logs(logs), use_integers_for_enums=True)

    def to_hex(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: base64.b64decode(v).hex() if k in ID_LENGTHS else to_hex(v) for k, v in node.items()}
        return [to_hex(v) for v in node] if isinstance(node, list) else node

    assert json.loads(read_lines(tmp_path / "logs.jsonl")[0]) == to_hex(golden)
    assert JsonLinesLogExporter(tmp_path).export([]) is LogRecordExportResult.SUCCESS  # nothing written
    assert len(read_lines(tmp_path / "logs.jsonl")) == 1


def test_agrees_with_the_receivers_encoder(tmp_path):
    spans, data = make_spans(), make_metrics()
    JsonLinesSpanExporter(tmp_path).export(spans)
    JsonLinesMetricExporter(tmp_path).export(data)
    assert json.loads(read_lines(tmp_path / "traces.jsonl")[0]) == \
        json.loads(receiver_to_otlp_json(encode_spans(spans)))
    assert json.loads(read_lines(tmp_path / "metrics.jsonl")[0]) == \
        json.loads(receiver_to_otlp_json(encode_metrics(data)))


def test_one_line_per_export_appended(tmp_path):
    spans = make_spans()
    exporter = JsonLinesSpanExporter(tmp_path)
    exporter.export(spans[:1])
    exporter.export(spans[1:])
    JsonLinesSpanExporter(tmp_path).export(spans)  # a new exporter appends, never truncates
    lines = read_lines(tmp_path / "traces.jsonl")
    assert len(lines) == 3
    assert [parse_otlp_json(x, ExportTraceServiceRequest) for x in lines] == \
        [encode_spans(spans[:1]), encode_spans(spans[1:]), encode_spans(spans)]


def test_empty_exports_write_nothing(tmp_path):
    assert JsonLinesSpanExporter(tmp_path).export([]) is SpanExportResult.SUCCESS
    assert JsonLinesMetricExporter(tmp_path).export(MetricsData([])) is MetricExportResult.SUCCESS
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["file", "below_file"])
def test_unwritable_directory_fails_without_raising(tmp_path, where):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    directory = blocker if where == "file" else blocker / "sub"
    assert JsonLinesSpanExporter(directory).export(make_spans()) is SpanExportResult.FAILURE
    assert JsonLinesMetricExporter(directory).export(make_metrics()) is MetricExportResult.FAILURE
    assert JsonLinesLogExporter(directory).export(make_logs()) is LogRecordExportResult.FAILURE


def test_check_output_directory_makes_the_directory_and_empty_traces_and_metrics_files(tmp_path):
    out = tmp_path / "a" / "b"
    check_output_directory(FileExporterConfig(directory=str(out)), "exporters.file")
    # a job that makes no span still leaves traces.jsonl; the probe file is gone; no logs file yet
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl", "traces.jsonl"]
    assert (out / "traces.jsonl").read_text() == "" and (out / "metrics.jsonl").read_text() == ""
    check_output_directory(OtlpExporterConfig(), "exporters.otlp")  # not a file exporter: nothing to check
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def test_check_output_directory_keeps_what_the_files_hold(tmp_path):
    JsonLinesSpanExporter(tmp_path).export(make_spans())
    before = (tmp_path / "traces.jsonl").read_text()
    check_output_directory(FileExporterConfig(directory=str(tmp_path)), "exporters.file")
    assert before and (tmp_path / "traces.jsonl").read_text() == before
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_check_output_directory_names_the_key_and_the_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out"
    with pytest.raises(ConfigError) as err:
        check_output_directory(FileExporterConfig(directory=str(out)), "exporters.file/2")
    assert err.value.path == "exporters.file/2.directory"
    assert f"cannot write to the output directory {out}: Not a directory" in str(err.value)


def test_check_output_directory_refuses_a_traces_file_it_cannot_append_to(tmp_path, monkeypatch):
    (tmp_path / "traces.jsonl").write_text("")
    # root may write any file mode: stand in for a non-root user's access(2) answer on that file
    monkeypatch.setattr(os, "access", lambda path, mode: not str(path).endswith("traces.jsonl"))
    with pytest.raises(ConfigError) as err:
        check_output_directory(FileExporterConfig(directory=str(tmp_path)), "exporters.file")
    assert f"({tmp_path / 'traces.jsonl'}): Permission denied" in str(err.value)


def test_lines_are_fsynced_at_most_once_a_second_and_at_flush_and_shutdown(tmp_path, monkeypatch):
    """Every line is written and flushed at once (a killed agent loses none); fsync, which cost ~0.8 us a span
    per 512-span line, runs on the first write after a second has passed, at force_flush and at shutdown, and
    not at all when nothing was written since the last one."""
    import otel_ebpf.emit.jsonfile as jsonfile

    now = [100.0]
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(jsonfile.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(jsonfile.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    exp = JsonLinesSpanExporter(tmp_path)
    spans = make_spans()
    for _ in range(3):
        assert exp.export(spans) == SpanExportResult.SUCCESS
    assert len((tmp_path / "traces.jsonl").read_text().splitlines()) == 3  # written (and flushed) unsynced
    assert synced == []
    now[0] += 1.0
    exp.export(spans)
    assert len(synced) == 1  # the first write a second after the last sync
    assert exp.force_flush() and len(synced) == 1  # nothing written since it
    exp.export(spans)
    assert exp.force_flush() and len(synced) == 2
    exp.export(spans)
    exp.shutdown()
    assert len(synced) == 3
    assert len((tmp_path / "traces.jsonl").read_text().splitlines()) == 6
