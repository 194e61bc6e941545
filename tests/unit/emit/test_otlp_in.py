"""otel_ebpf.emit.otlp_in: OTLP protobuf requests -> SDK ReadableSpan / MetricsData / ReadableLogRecord,
round trip."""
from __future__ import annotations

from opentelemetry import trace as trace_api
from opentelemetry._logs import LogRecord as SdkLogRecord
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from otel_ebpf.emit.otlp_in import logs_from_request, metrics_from_request, spans_from_request

T0 = 1_700_000_000_000_000_000


def _wire(request, cls):
    """Through bytes, as the OTLP server receives it."""
    out = cls()
    out.ParseFromString(request.SerializeToString())
    return out


def _sdk_spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"host.name": "node-a", "service.name": "train"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("otel_ebpf.nccl", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.26.0")
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("vendor", "x")]))
    ctx = trace_api.set_span_in_context(trace_api.NonRecordingSpan(remote))
    link = Link(SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1)), {"nccl.link": "recv"})
    parent = tracer.start_span("nccl AllReduce", context=ctx, kind=SpanKind.CLIENT, start_time=T0,
                               links=[link], attributes={
                                   "nccl.rank": 3, "nccl.bytes": 1 << 40, "ratio": 0.5, "ok": True,
                                   "nccl.devices": (0, 1, 2), "names": ("a", "b"), "nccl.comm.id": "00ff"})
    parent.add_event("nccl.desync", {"nccl.missing_ranks": (1, 2)}, timestamp=T0 + 5)
    parent.set_status(Status(StatusCode.ERROR, "ncclInternalError"))
    child = tracer.start_span("ncclSend", context=trace_api.set_span_in_context(parent), start_time=T0 + 1,
                              kind=SpanKind.PRODUCER)
    child.end(end_time=T0 + 2)
    parent.end(end_time=T0 + 10)
    return exporter.get_finished_spans()


def _fields(span):
    ctx, parent = span.context, span.parent
    return (span.name, ctx.trace_id, ctx.span_id, ctx.trace_flags.sampled, tuple(ctx.trace_state.items()),
            parent and (parent.trace_id, parent.span_id, parent.is_remote), span.kind, span.status.status_code,
            span.status.description, dict(span.attributes), [(e.name, dict(e.attributes), e.timestamp)
                                                             for e in span.events],
            [(lk.context.trace_id, lk.context.span_id, lk.context.is_remote, dict(lk.attributes))
             for lk in span.links], span.start_time, span.end_time, dict(span.resource.attributes),
            span.instrumentation_scope.name, span.instrumentation_scope.version,
            span.instrumentation_scope.schema_url)


def test_spans_round_trip_through_the_sdk_encoder_unchanged():
    original = _sdk_spans()
    request = _wire(encode_spans(original), ExportTraceServiceRequest)
    converted, drops = spans_from_request(request)
    assert not drops
    assert [_fields(s) for s in converted] == [_fields(s) for s in original]
    assert encode_spans(converted) == encode_spans(original)  # and back to the same protobuf


def test_spans_of_one_resource_share_it_and_are_sampled():
    converted, _ = spans_from_request(_wire(encode_spans(_sdk_spans()), ExportTraceServiceRequest))
    assert converted[0].resource is converted[1].resource
    assert all(s.context.trace_flags.sampled for s in converted)


def test_bad_ids_drop_the_span_or_link_and_count_it():
    request = encode_spans(_sdk_spans())
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[0].span_id = b"\x00" * 8                 # all-zero: invalid
    spans[1].links.add(trace_id=b"\x01" * 3, span_id=b"\x02" * 8)  # short trace id: link left out
    converted, drops = spans_from_request(request)
    assert drops == {"malformed_span": 1, "malformed_link": 1}
    assert len(converted) == 1 and len(converted[0].links) == 1
    spans[1].parent_span_id = b"\x01\x02"
    assert spans_from_request(request)[1]["malformed_span"] == 2


def _sdk_metrics():
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=Resource.create({"host.name": "node-b"}), metric_readers=[reader])
    meter = provider.get_meter("otel_ebpf.nccl", "0.1")
    meter.create_counter("nccl.calls", unit="{call}", description="calls").add(3, {"nccl.op": "AllReduce"})
    meter.create_up_down_counter("inflight").add(-2)
    meter.create_gauge("gpu.temp", unit="Cel").set(71.5, {"gpu": 0})
    hist = meter.create_histogram("nccl.enqueue.duration", unit="s")
    for v in (0.001, 0.02, 3.0):
        hist.record(v, {"nccl.op": "AllReduce"})
    return reader.get_metrics_data()


def test_metrics_round_trip_sum_gauge_histogram():
    original = encode_metrics(_sdk_metrics())
    data, drops = metrics_from_request(_wire(original, ExportMetricsServiceRequest))
    assert not drops
    kinds = {m.name: type(m.data).__name__ for rm in data.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics}
    assert kinds == {"nccl.calls": "Sum", "inflight": "Sum", "gpu.temp": "Gauge",
                     "nccl.enqueue.duration": "Histogram"}
    assert encode_metrics(data) == original


def test_unsupported_and_malformed_metrics_are_counted_not_passed():
    request = encode_metrics(_sdk_metrics())
    scope = request.resource_metrics[0].scope_metrics[0]
    exp = scope.metrics.add(name="exp")
    exp.exponential_histogram.data_points.add(count=1, scale=2)
    exp.exponential_histogram.data_points.add(count=2, scale=2)
    scope.metrics.add(name="summary").summary.data_points.add(count=1)
    bad = scope.metrics.add(name="bad.hist")
    bad.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    bad.histogram.data_points.add(count=1, bucket_counts=[1, 0], explicit_bounds=[1.0, 2.0])
    data, drops = metrics_from_request(request)
    assert drops == {"unsupported_metric_type": 3, "malformed_metric": 1}
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert names == {"nccl.calls", "inflight", "gpu.temp", "nccl.enqueue.duration"}


def test_repeated_resource_is_merged_so_the_encoder_keeps_all():
    request = encode_metrics(_sdk_metrics())
    request.resource_metrics.add().CopyFrom(request.resource_metrics[0])
    data, _ = metrics_from_request(request)
    assert len(data.resource_metrics) == 1
    assert sum(len(sm.metrics) for sm in data.resource_metrics[0].scope_metrics) == 8
    sums = [m.data for sm in data.resource_metrics[0].scope_metrics for m in sm.metrics if m.name == "nccl.calls"]
    assert sums[0].aggregation_temporality is AggregationTemporality.CUMULATIVE and sums[0].is_monotonic


# -- logs ------------------------------------------------------------------------------------
def _sdk_logs() -> list[ReadableLogRecord]:
    """Log records of two resources, one with ids, nested and binary bodies."""
    rank = Resource({"host.name": "node-a", "process.pid": 42}, "https://opentelemetry.io/schemas/1.26.0")
    scope = InstrumentationScope("otel_ebpf.hang", "1.0", None, {"k": "v"})
    ctx = trace_api.set_span_in_context(trace_api.NonRecordingSpan(
        SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(1))))
    none = trace_api.set_span_in_context(trace_api.INVALID_SPAN)

    def rec(context, **kw):
        return SdkLogRecord(timestamp=T0, observed_timestamp=T0 + 9, context=context, **kw)

    return [
        ReadableLogRecord(rec(ctx, severity_text="WARN", severity_number=SeverityNumber.WARN, body="a\nb",
                              attributes={"nccl.rank": 3, "ranks": (1, 2), "ok": True, "r": 0.5},
                              event_name="otel_ebpf.nccl.rank.stack"), rank, scope),
        ReadableLogRecord(rec(none, severity_number=SeverityNumber.ERROR2, body={"frames": ("f", "g"), "n": 2},
                              event_name="otel_ebpf.nccl.straggler"), rank, scope),
        ReadableLogRecord(rec(none, body=b"\x00\x01"), Resource({"service.name": "otel-ebpf"}),
                          InstrumentationScope("otel_ebpf")),
    ]


def _log_fields(r: ReadableLogRecord):
    lr, scope = r.log_record, r.instrumentation_scope
    return (lr.timestamp, lr.observed_timestamp, lr.trace_id, lr.span_id, int(lr.trace_flags), lr.severity_text,
            lr.severity_number or SeverityNumber.UNSPECIFIED,  # none and UNSPECIFIED are both 0 on the wire
            lr.body, dict(lr.attributes or {}), lr.event_name, dict(r.resource.attributes), r.resource.schema_url,
            scope and (scope.name, scope.version, dict(scope.attributes or {})))


def test_logs_round_trip_through_the_sdk_encoder_unchanged():
    original = _sdk_logs()
    converted, drops = logs_from_request(_wire(encode_logs(original), ExportLogsServiceRequest))
    assert not drops
    assert [_log_fields(r) for r in converted] == [_log_fields(r) for r in original]
    assert converted[0].log_record.trace_id == 0xABC and converted[1].log_record.trace_id == 0
    assert converted[1].log_record.body == {"frames": ("f", "g"), "n": 2}
    assert converted[0].resource is converted[1].resource  # one Resource per ResourceLogs
    assert encode_logs(converted) == encode_logs(original)  # and back to the same protobuf


def test_logs_with_bad_ids_are_left_out_and_counted_odd_severities_kept():
    request = encode_logs(_sdk_logs())
    records = request.resource_logs[0].scope_logs[0].log_records
    records[0].trace_id = b"\x01" * 5  # neither empty nor 16 bytes
    records[1].severity_number = 99  # outside the OTel range: kept, UNSPECIFIED
    records[1].ClearField("time_unix_nano")
    converted, drops = logs_from_request(request)
    assert drops == {"malformed_log": 1} and len(converted) == 2
    assert converted[0].log_record.severity_number is SeverityNumber.UNSPECIFIED
    assert converted[0].log_record.timestamp is None and converted[0].log_record.observed_timestamp == T0 + 9
    records[1].span_id = b"\x02" * 3
    assert logs_from_request(request)[1] == {"malformed_log": 2}
    assert logs_from_request(ExportLogsServiceRequest()) == ([], {})
