"""otel_ebpf.emit.otlp_direct: the SDK's OTLP exporters, sending the direct encoder's bytes, over real gRPC and HTTP.

The receiving end is the project's OTLP server (tests/support/otlp_sink.py), which parses every
request with the official proto classes; what it gets must equal what the SDK's own encoder makes
of the same batch. A raw gRPC server stands in for a collector that refuses a request once, to
show the SDK's retry semantics are kept and the batch is encoded once.
"""
from __future__ import annotations

import logging
import threading
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk._logs.export import LogRecordExportResult
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_ebpf.emit import otlp_direct
from otel_ebpf.emit.exporters import OtlpExporterConfig, build_exporters, build_log_exporter
from otel_ebpf.emit.otlp_direct import DirectGrpcSpanExporter, DirectHttpSpanExporter
from tests.support.otlp_sink import OtlpSink
from tests.unit.emit.test_otlp_json import direct_span, direct_spans, log_records, resources, traced_spans


def clean_spans() -> list[Any]:
    """Every case of the golden tests but NaN (NaN != NaN when messages are compared)."""
    return [s for s in traced_spans() + direct_spans() if "f.nan" not in (s.attributes or {})]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_spans_and_logs_arrive_as_the_sdk_encodes_them(protocol: str) -> None:
    spans, records = clean_spans(), [r for r in log_records() if "f.nan" not in (r.log_record.attributes or {})]
    with OtlpSink() as sink:
        endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
        cfg = OtlpExporterConfig(endpoint=endpoint, protocol=protocol)  # type: ignore[arg-type]
        span_exporter, metric_exporter = build_exporters(cfg)
        log_exporter = build_log_exporter(cfg)
        assert isinstance(span_exporter, DirectGrpcSpanExporter if protocol == "grpc" else DirectHttpSpanExporter)
        assert span_exporter.export(spans) is SpanExportResult.SUCCESS
        assert log_exporter is not None and log_exporter.export(records) is LogRecordExportResult.SUCCESS
        assert sink.wait_for(lambda: len(sink.requests()) >= 2)
        trace_request, logs_request = sink.requests()[:2]
        for exporter in (span_exporter, metric_exporter, log_exporter):
            exporter.shutdown()
    assert trace_request == encode_spans(spans)
    assert logs_request == encode_logs(records)
    assert span_exporter.fallbacks == 0 and log_exporter.fallbacks == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_batch_it_cannot_write_exactly_goes_the_sdk_way_and_is_counted(protocol: str,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    res = resources()[0]
    bad = [direct_span("bad", {"ok": 1, "big": 2**64}, resource=res, scope=None)]  # past int64: the SDK drops it
    with OtlpSink() as sink, caplog.at_level(logging.INFO, logger="otel_ebpf.emit.otlp_direct"):
        endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
        exporter = (DirectGrpcSpanExporter(endpoint=endpoint, insecure=True) if protocol == "grpc"
                    else DirectHttpSpanExporter(endpoint=f"{endpoint}/v1/traces"))
        assert exporter.export(bad) is SpanExportResult.SUCCESS
        assert exporter.export(bad) is SpanExportResult.SUCCESS
        assert sink.wait_for(lambda: len(sink.spans()) >= 2)
        exporter.shutdown()
    assert exporter.fallbacks == 2
    assert [r for r in caplog.records if "cannot write exactly" in r.getMessage()], "said once"
    (_, _, span), _ = sink.spans()
    assert span.name == "bad"


def test_a_span_nobody_can_encode_fails_the_http_batch_without_raising(caplog: pytest.LogCaptureFixture) -> None:
    span = direct_span("s", {}, resource=resources()[0], scope=None)
    span._kind = "client"  # type: ignore[assignment]  # what neither encoder can write
    with OtlpSink() as sink:
        exporter = DirectHttpSpanExporter(endpoint=f"{sink.http_endpoint}/v1/traces")
        with caplog.at_level(logging.ERROR, logger="otel_ebpf.emit.otlp_direct"):
            assert exporter.export([span]) is SpanExportResult.FAILURE
        exporter.shutdown()
    assert any("Failed to encode span batch" in r.getMessage() for r in caplog.records)


class RefusingCollector:
    """A gRPC TraceService that answers the first request UNAVAILABLE with a RetryInfo, then OK;
    it keeps each request's bytes as they came."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self._lock = threading.Lock()
        handler = grpc.method_handlers_generic_handler("opentelemetry.proto.collector.trace.v1.TraceService", {
            "Export": grpc.unary_unary_rpc_method_handler(self._export, request_deserializer=None,
                                                          response_serializer=None)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _export(self, body: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self.bodies.append(body)
            first = len(self.bodies) == 1
        if first:
            info = RetryInfo(retry_delay=Duration(nanos=50_000_000)).SerializeToString()
            context.abort_with_status(_Status(grpc.StatusCode.UNAVAILABLE, "busy", (("google.rpc.retryinfo-bin",
                                                                                     info),)))
        return ExportTraceServiceResponse().SerializeToString()


class _Status(grpc.Status):
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: Any) -> None:
        self.code, self.details, self.trailing_metadata = code, details, trailing_metadata


def test_a_refused_request_is_retried_with_the_same_bytes_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    spans = clean_spans()
    calls = []
    real = otlp_direct.spans_to_otlp_proto
    monkeypatch.setattr(otlp_direct, "spans_to_otlp_proto", lambda b: calls.append(1) or real(b))
    collector = RefusingCollector()
    try:
        exporter = DirectGrpcSpanExporter(endpoint=f"127.0.0.1:{collector.port}", insecure=True, timeout=10)
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        exporter.shutdown()
    finally:
        collector.server.stop(None)
    assert len(collector.bodies) == 2 and collector.bodies[0] == collector.bodies[1]
    assert collector.bodies[0] == encode_spans(spans).SerializeToString()
    assert len(calls) == 1, "encoded once for both attempts"
    assert exporter.encoder._last is None, "the batch is let go after its export"
