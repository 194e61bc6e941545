"""OtlpServer and OtlpSink: real OTel SDK exporters over real loopback sockets."""
from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ebpf.core.errors import ConfigError
from otel_ebpf.receivers.otlp import OtlpBindError, OtlpServer, parse_endpoint, to_otlp_json
from tests.support.otlp_sink import OtlpSink, decode_attrs, load_jsonl, spans_from_jsonl

REPO = Path(__file__).resolve().parents[3]
TRACE_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TRACE_ID_HEX = "5b8efff798038103d269b633813fc60c"
SPAN_ID_HEX = "eee19b7ec3c1b174"


@pytest.fixture
def sink():
    with OtlpSink() as running:
        yield running


def make_spans(service: str = "svc") -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service, "host.rank": 3}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("test.scope").start_as_current_span("parent"):
        with provider.get_tracer("test.scope").start_as_current_span("child") as child:
            child.set_attribute("nccl.bytes", 1024)
    provider.shutdown()
    return list(memory.get_finished_spans())


def make_metrics():
    reader = InMemoryMetricReader()
    resource = Resource.create({"service.name": "metrics-svc"})
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    meter = provider.get_meter("test.meter")
    meter.create_counter("gpu.kernel.launches").add(5, {"gpu": 0})
    meter.create_histogram("gpu.kernel.duration").record(1.5)
    data = reader.get_metrics_data()
    provider.shutdown()
    return data


def post(url: str, body: bytes, ctype: str = "application/x-protobuf", encoding: str | None = None):
    headers = {"Content-Type": ctype}
    if encoding:
        headers["Content-Encoding"] = encoding
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def grpc_raw_export(port: int, body: bytes) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            channel.unary_unary(TRACE_METHOD)(body, timeout=5)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def otlp_json_request() -> dict:
    return {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]},
        "scopeSpans": [{"scope": {"name": "json.scope"}, "spans": [
            {"traceId": TRACE_ID_HEX, "spanId": SPAN_ID_HEX, "name": "a", "kind": 2,
             "startTimeUnixNano": "1000", "endTimeUnixNano": 2000},
            {"traceId": TRACE_ID_HEX, "spanId": "0000000000000001", "parentSpanId": SPAN_ID_HEX,
             "name": "b", "kind": "SPAN_KIND_CLIENT"},
        ]}]}]}


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_span_exporters_deliver_spans_with_resource(sink, transport, compressed):
    if transport == "grpc":
        exporter = GrpcSpanExporter(endpoint=sink.grpc_endpoint, insecure=True, timeout=5,
                                    compression=grpc.Compression.Gzip if compressed else None)
    else:
        exporter = HttpSpanExporter(endpoint=f"{sink.http_endpoint}/v1/traces", timeout=5,
                                    compression=HttpCompression.Gzip if compressed else None)
    spans = make_spans()
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    rows = sink.spans()
    assert sorted(span.name for _, _, span in rows) == ["child", "parent"]
    resource, scope, child = next(row for row in rows if row[2].name == "child")
    assert resource["service.name"] == "svc" and resource["host.rank"] == 3
    assert scope == "test.scope"
    assert decode_attrs(child.attributes) == {"nccl.bytes": 1024}
    assert child.trace_id == spans[0].context.trace_id.to_bytes(16, "big")
    assert sink.stats.spans == 2 and sink.stats.requests == 1


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_metric_exporters_deliver_points_with_resource(sink, transport):
    if transport == "grpc":
        exporter = GrpcMetricExporter(endpoint=sink.grpc_endpoint, insecure=True, timeout=5)
    else:
        exporter = HttpMetricExporter(endpoint=f"{sink.http_endpoint}/v1/metrics", timeout=5,
                                      compression=HttpCompression.Gzip)
    assert exporter.export(make_metrics()) is MetricExportResult.SUCCESS
    exporter.shutdown()
    assert sink.metric_names() == {"gpu.kernel.launches", "gpu.kernel.duration"}
    assert {attrs["service.name"] for attrs, _ in sink.metrics()} == {"metrics-svc"}
    assert sink.stats.metric_points == 2


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_http_json_accepts_hex_ids_and_enum_names_or_ints(sink, encoding):
    body = json.dumps(otlp_json_request()).encode()
    status, reply = post(f"{sink.http_endpoint}/v1/traces", gzip.compress(body) if encoding else body,
                         "application/json", encoding)
    assert (status, json.loads(reply)) == (200, {})
    (res_a, scope, a), (_, _, b) = sink.spans()
    assert res_a == {"service.name": "json-svc"} and scope == "json.scope"
    assert a.trace_id.hex() == TRACE_ID_HEX and a.span_id.hex() == SPAN_ID_HEX
    assert b.parent_span_id.hex() == SPAN_ID_HEX
    assert (a.kind, b.kind) == (2, 3) and (a.start_time_unix_nano, a.end_time_unix_nano) == (1000, 2000)


def test_malformed_bodies_are_rejected_and_counted(sink):
    status, reply = post(f"{sink.http_endpoint}/v1/traces", b"\xff\xff\xff\xff")
    assert status == 400 and b"cannot decode" in reply
    status, reply = post(f"{sink.http_endpoint}/v1/traces", b"{not json", "application/json")
    assert status == 400 and "cannot decode" in json.loads(reply)["message"]
    status, _ = post(f"{sink.http_endpoint}/v1/traces", b'{"resourceSpans": 5}', "application/json")
    assert status == 400  # valid JSON, wrong shape: json_format.ParseError
    status, _ = post(f"{sink.http_endpoint}/v1/traces", b"not gzip", encoding="gzip")
    assert status == 400
    assert grpc_raw_export(sink.server.grpc_port, b"\xff\xff\xff\xff") is grpc.StatusCode.INVALID_ARGUMENT
    assert sink.stats.rejected_malformed == 5 and sink.stats.requests == 5 and sink.requests() == []


def test_raising_callback_returns_error_and_server_keeps_serving(sink):
    sink.fail_with = RuntimeError("consumer bug")
    grpc_exporter = GrpcSpanExporter(endpoint=sink.grpc_endpoint, insecure=True, timeout=5)
    http_exporter = HttpSpanExporter(endpoint=f"{sink.http_endpoint}/v1/traces", timeout=5)
    assert grpc_raw_export(sink.server.grpc_port, b"") is grpc.StatusCode.INTERNAL
    assert post(f"{sink.http_endpoint}/v1/traces", b"")[0] == 500
    assert grpc_exporter.export(make_spans()) is SpanExportResult.FAILURE
    sink.fail_with = None
    assert grpc_exporter.export(make_spans()) is SpanExportResult.SUCCESS
    assert http_exporter.export(make_spans()) is SpanExportResult.SUCCESS
    grpc_exporter.shutdown()
    http_exporter.shutdown()
    assert sink.stats.callback_errors == 3 and sink.stats.spans == 4


def test_oversized_requests_are_rejected_and_counted():
    with OtlpSink(max_request_bytes=1024) as small:
        url = f"{small.http_endpoint}/v1/traces"
        assert post(url, b"\x00" * 2048)[0] == 413
        assert post(url, gzip.compress(b"\x00" * 4096), encoding="gzip")[0] == 413  # inflates too big
        assert grpc_raw_export(small.server.grpc_port, b"\x00" * 2048) is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert small.stats.rejected_too_large == 3


def test_unserved_signal_and_bad_requests_are_refused():
    with OtlpServer(grpc_endpoint=None, http_endpoint="127.0.0.1:0", on_traces=lambda r: None) as server:
        base = f"http://127.0.0.1:{server.http_port}"
        assert post(f"{base}/v1/metrics", b"")[0] == 404
        assert post(f"{base}/v1/nothing", b"")[0] == 404
        assert post(f"{base}/v1/traces", b"", "text/plain")[0] == 415
        assert post(f"{base}/v1/traces", b"", encoding="br")[0] == 415
        assert post(f"{base}/v1/traces", b"")[0] == 200
        assert server.stats.rejected_unsupported == 4 and server.grpc_port == 0


def test_shutdown_is_safe_without_start_and_twice():
    server = OtlpServer(grpc_endpoint=":0", http_endpoint=":0", on_traces=lambda r: None)
    server.shutdown()
    server.shutdown()
    started = OtlpServer(grpc_endpoint=":0", http_endpoint=":0", on_traces=lambda r: None)
    started.start()
    assert started.grpc_port > 0 and started.http_port > 0
    started.shutdown()
    started.shutdown()
    with pytest.raises(RuntimeError):
        started.start()


@pytest.mark.parametrize("which", ["grpc", "http"])
def test_port_in_use_raises_error_naming_the_endpoint(which):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        endpoints = {"grpc_endpoint": ":0", "http_endpoint": ":0", f"{which}_endpoint": f"127.0.0.1:{port}"}
        server = OtlpServer(on_traces=lambda r: None, **endpoints)
        with pytest.raises(OtlpBindError, match=rf"(?i){which} server to 127\.0\.0\.1:{port}.*in use"):
            server.start()
        server.shutdown()


def test_two_servers_cannot_share_a_port():
    with OtlpServer(grpc_endpoint=":0", http_endpoint=None, on_traces=lambda r: None) as first:
        second = OtlpServer(grpc_endpoint=f":{first.grpc_port}", http_endpoint=None, on_traces=lambda r: None)
        with pytest.raises(OtlpBindError):
            second.start()


def test_endpoints_default_to_loopback_and_validate():
    assert parse_endpoint(":0") == ("127.0.0.1", 0)
    assert parse_endpoint("http://[::1]:4317/") == ("::1", 4317)
    defaults = OtlpServer.__init__.__kwdefaults__
    assert defaults["grpc_endpoint"] == "127.0.0.1:4317" and defaults["http_endpoint"] == "127.0.0.1:4318"
    with pytest.raises(ConfigError, match="grpc_endpoint"):
        OtlpServer(grpc_endpoint="localhost", on_traces=lambda r: None)


def test_jsonl_helpers_read_what_the_network_path_gets(sink, tmp_path):
    exporter = GrpcSpanExporter(endpoint=sink.grpc_endpoint, insecure=True, timeout=5)
    assert exporter.export(make_spans("file-svc")) is SpanExportResult.SUCCESS
    exporter.shutdown()
    path = tmp_path / "out.jsonl"
    path.write_text("".join(to_otlp_json(r) + "\n" for r in sink.requests()))
    line = load_jsonl(path)[0]
    trace_id = line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"]
    assert len(trace_id) == 32 and int(trace_id, 16)  # hex, not base64
    from_file = [(res, scope, span.SerializeToString()) for res, scope, span in spans_from_jsonl(path)]
    assert from_file == [(res, scope, span.SerializeToString()) for res, scope, span in sink.spans()]


def test_standalone_sink_appends_json_lines_until_sigterm(tmp_path):
    out = tmp_path / "sink.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.otlp_sink", "--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0",
         "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        banner = proc.stdout.readline().split()  # "otlp-sink grpc=PORT http=PORT"
        http_port = int(banner[2].split("=")[1])
        body = json.dumps(otlp_json_request()).encode()
        assert post(f"http://127.0.0.1:{http_port}/v1/traces", body, "application/json")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    [(resource, _scope, span), _] = spans_from_jsonl(out)
    assert resource == {"service.name": "json-svc"} and span.trace_id.hex() == TRACE_ID_HEX


def test_request_roundtrips_through_otlp_json():
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.kind = bytes.fromhex(TRACE_ID_HEX), bytes.fromhex(SPAN_ID_HEX), 2
    text = to_otlp_json(request)
    assert TRACE_ID_HEX in text and '"kind":2' in text
    from otel_ebpf.receivers.otlp import parse_otlp_json
    assert parse_otlp_json(text, ExportTraceServiceRequest) == request


def export_traces(server: OtlpServer, transport: str, body: bytes) -> bool:
    """Send a trace request's protobuf ``body`` over ``transport`` (grpc, http, http-gzip, or http-json: the parsed
    body as OTLP/JSON); whether it was accepted."""
    url = f"http://127.0.0.1:{server.http_port}/v1/traces"
    if transport == "grpc":
        return grpc_raw_export(server.grpc_port, body) is grpc.StatusCode.OK
    if transport == "http":
        return post(url, body)[0] == 200
    if transport == "http-gzip":
        return post(url, gzip.compress(body), encoding="gzip")[0] == 200
    return post(url, to_otlp_json(ExportTraceServiceRequest.FromString(body)).encode(), "application/json")[0] == 200


@pytest.mark.parametrize("transport", ["grpc", "http", "http-gzip", "http-json"])
def test_a_callback_reads_the_bytes_its_request_was_parsed_from(transport):
    """received_bytes: the protobuf body as it came (gzip undone), only for the request in hand and only while its
    callback runs; JSON has none. Bytes no serializer would write (fields in reverse order) come back as sent."""
    from otel_ebpf.receivers.otlp import received_bytes

    def field(tag: int, payload: bytes) -> bytes:  # length-delimited, payloads under 128 bytes
        return bytes([tag, len(payload)]) + payload

    trace_id, span_id = bytes.fromhex(TRACE_ID_HEX), bytes.fromhex(SPAN_ID_HEX)
    span = field(0x2a, b"a") + field(0x12, span_id) + field(0x0a, trace_id)  # name 5, span id 2, trace id 1
    body = field(0x0a, field(0x12, field(0x12, span)))  # resource_spans 1 > scope_spans 2 > spans 2
    pb = ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": [
        {"trace_id": trace_id, "span_id": span_id, "name": "a"}]}]}])
    assert ExportTraceServiceRequest.FromString(body) == pb and body != pb.SerializeToString()
    seen: list[tuple[object, bytes | None]] = []

    def on_traces(request):
        seen.append((request, received_bytes(request)))
        assert received_bytes(ExportTraceServiceRequest()) is None  # another request: not its bytes

    server = OtlpServer(grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0", on_traces=on_traces)
    server.start()
    try:
        assert export_traces(server, transport, body)
    finally:
        server.shutdown()
    (request, raw), = seen
    assert request == pb
    assert raw == (None if transport == "http-json" else body)
    assert received_bytes(request) is None  # after the callback


@pytest.mark.parametrize("transport", ["grpc", "http", "http-gzip", "http-json"])
def test_decode_traces_gets_the_protobuf_bytes_and_its_result_replaces_the_parsed_request(transport):
    """decode_traces: the protobuf body of each trace request (gzip undone), never JSON; what it returns is handed
    over and its ``items`` counted; None has the request parsed and handed over; bytes it hands back that do not
    parse are rejected as malformed, as without it."""

    class Decoded:
        items = 7

    made = Decoded()
    given: list[bytes] = []
    seen: list[object] = []
    request = ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": [
        {"trace_id": bytes.fromhex(TRACE_ID_HEX), "span_id": bytes.fromhex(SPAN_ID_HEX), "name": "a"}]}]}])
    body = request.SerializeToString()

    def decode(raw: bytes) -> Decoded | None:
        given.append(raw)
        return made if raw == body else None

    server = OtlpServer(grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0", on_traces=seen.append,
                        decode_traces=decode)
    server.start()
    other = ExportTraceServiceRequest(resource_spans=[{"schema_url": "s"}])
    try:
        assert export_traces(server, transport, body) and export_traces(server, transport, other.SerializeToString())
        if transport != "http-json":
            assert not export_traces(server, transport, b"\xff\xff\xff\xff")
    finally:
        server.shutdown()
    stats = server.stats
    if transport == "http-json":
        assert given == [] and seen == [request, other] and stats.spans == 1
    else:
        assert given == [body, other.SerializeToString(), b"\xff\xff\xff\xff"]
        assert seen == [made, other] and stats.spans == 7 and stats.rejected_malformed == 1
