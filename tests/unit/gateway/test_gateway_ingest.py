"""The gateway's ingest under pressure: its OTLP receiver refuses a request whole when the queue has
no room (the real SDK exporters retry it, it lands once), and the ExportGate holds the pipeline
while an exporter's queue is full."""
from __future__ import annotations

import threading
import time

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_ebpf.gateway.exportgate import ExportGate
from otel_ebpf.gateway.losses import GatewayTelemetry
from otel_ebpf.gateway.ingest import OtlpIngest
from otel_ebpf.receivers.otlp import Config as OtlpReceiverConfig, OtlpReceiver
from otel_ebpf.core.pipeline import BoundedQueue, Context, ListConsumer
from otel_ebpf.core.telemetry import DROPPED, RECEIVED, REFUSED
from tests.unit.receivers.test_otlp_server import make_spans


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_full_queue_refuses_the_request_whole_and_the_sdk_retry_lands_once(transport):
    ctx = Context(telemetry=GatewayTelemetry())
    out = ListConsumer()
    traces = BoundedQueue(out, ctx.telemetry, max_events=3, name="traces")
    metrics = BoundedQueue(ListConsumer(), ctx.telemetry, max_events=3, name="metrics")
    assert traces.offer(["a", "b"])  # 2 of 3 taken: a request of 2 spans does not fit
    cfg = OtlpReceiverConfig(grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0", wait_for_room=0.0,
                             retry_after=0.3)
    receiver = OtlpReceiver(cfg, ctx, OtlpIngest(ctx.telemetry, traces, metrics))
    receiver.start()
    try:
        if transport == "grpc":
            exporter = GrpcSpanExporter(endpoint=f"http://127.0.0.1:{receiver.grpc_port}", insecure=True, timeout=10)
        else:
            exporter = HttpSpanExporter(endpoint=f"http://127.0.0.1:{receiver.http_port}/v1/traces", timeout=10)
        result: list[SpanExportResult] = []
        sender = threading.Thread(target=lambda: result.append(exporter.export(make_spans())))
        sender.start()
        deadline = time.monotonic() + 5
        while receiver.stats.refused < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert receiver.stats.refused >= 1 and out.events == []
        assert ctx.telemetry.get(RECEIVED) == 0  # nothing of a refused request is counted as received
        traces.start()  # room comes back
        sender.join(timeout=15)
        exporter.shutdown()
    finally:
        receiver.shutdown()
        traces.shutdown()
    assert result == [SpanExportResult.SUCCESS]
    names = [getattr(s, "name", s) for s in out.take()]
    assert names.count("parent") == names.count("child") == 1  # the retry delivered it, once
    refusals = receiver.stats.refused
    assert ctx.telemetry.get(REFUSED, receiver="otlp", signal="traces") == 2 * refusals
    assert ctx.telemetry.get(RECEIVED) == 2 and ctx.telemetry.get(DROPPED) == 0


class FakeQueue:
    def __init__(self, capacity: int, size: int) -> None:
        self.capacity, self._size = capacity, size

    def size(self) -> int:
        return self._size


def test_export_gate_holds_batches_until_the_exporter_queue_has_room():
    out = ListConsumer()
    q = FakeQueue(capacity=4, size=4)
    gate = ExportGate(out, lambda: [q], max_wait=10)
    threading.Timer(0.3, lambda: setattr(q, "_size", 0)).start()
    t0 = time.monotonic()
    gate.consume([1, 2, 3])
    assert 0.25 <= time.monotonic() - t0 < 5 and out.take() == [1, 2, 3]
    assert (gate.waits, gate.expired) == (1, 0)
    gate.consume(list(range(10)))  # chunks of at most the capacity, each fits an empty queue
    assert out.take() == list(range(10)) and gate.waits == 1


def test_export_gate_passes_on_after_max_wait_and_at_release():
    out = ListConsumer()
    q = FakeQueue(capacity=4, size=4)
    gate = ExportGate(out, lambda: [q], max_wait=0.2)
    gate.consume([1])
    assert out.take() == [1] and gate.expired == 1  # the exporter counts what does not fit
    gate = ExportGate(out, lambda: [q], max_wait=60)
    threading.Timer(0.2, gate.release).start()
    t0 = time.monotonic()
    gate.consume([2])
    assert time.monotonic() - t0 < 5 and out.take() == [2]
    gate.consume([3])  # released for good: no wait
    assert out.take() == [3] and gate.expired == 2


def test_trace_requests_are_decoded_from_their_bytes_and_what_the_decoder_hands_back_is_parsed():
    """The receiver hands the ingest's decode_traces each protobuf trace request first: the same spans and counts
    as from the parsed request. Bytes the C decoder does not read to the end go the parsed way: a status message
    that is not UTF-8 (the parse refuses the request: rejected, nothing queued), a resource with entity_refs."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_ebpf.emit.otlp_in import spans_from_request
    from otel_ebpf.gateway.ingest import DecodedSpans
    from otel_ebpf.receivers.otlp import Decoding
    from tests.unit.receivers.test_otlp_server import grpc_raw_export

    ctx = Context(telemetry=GatewayTelemetry())
    out = ListConsumer()
    traces = BoundedQueue(out, ctx.telemetry, max_events=100, name="traces")
    ingest = OtlpIngest(ctx.telemetry, traces, BoundedQueue(ListConsumer(), ctx.telemetry, max_events=3))
    assert isinstance(ingest, Decoding)
    request = encode_spans(make_spans())
    decoded = ingest.decode_traces(request.SerializeToString())
    assert type(decoded) is DecodedSpans and decoded.items == 2
    ref, drops = spans_from_request(request)
    assert [(s.name, dict(s.attributes), s.context, s.parent) for s in decoded.spans] == \
        [(s.name, dict(s.attributes), s.context, s.parent) for s in ref] and decoded.drops == drops
    bad_status = ExportTraceServiceRequest.FromString(request.SerializeToString())
    bad_status.resource_spans[0].scope_spans[0].spans[0].status.message = "ok"
    raw = bad_status.SerializeToString().replace(b"\x12\x02ok", b"\x12\x02\xff\xfe")
    refs = ExportTraceServiceRequest.FromString(request.SerializeToString())
    refs.resource_spans[0].resource.entity_refs.add(type="service")
    assert ingest.decode_traces(raw) is None and ingest.decode_traces(refs.SerializeToString()) is None
    assert ingest.decode_traces(request.SerializeToString()[:-3]) is None
    cfg = OtlpReceiverConfig(grpc_endpoint="127.0.0.1:0", http_endpoint="", wait_for_room=0.0)
    receiver = OtlpReceiver(cfg, ctx, ingest)
    receiver.start()
    traces.start()
    try:
        assert grpc_raw_export(receiver.grpc_port, request.SerializeToString()) is grpc.StatusCode.OK
        assert grpc_raw_export(receiver.grpc_port, refs.SerializeToString()) is grpc.StatusCode.OK
        assert grpc_raw_export(receiver.grpc_port, raw) is grpc.StatusCode.INVALID_ARGUMENT
    finally:
        receiver.shutdown()
        traces.shutdown()
    assert [s.name for s in out.take()] == [s.name for s in ref] * 2
    assert receiver.stats.spans == 4 and receiver.stats.rejected_malformed == 1
    assert ctx.telemetry.get(RECEIVED) == 4


def test_bytes_the_c_decoder_handed_back_are_not_decoded_again_after_the_parse(monkeypatch):
    """A request off the C decoder's fast path (a resource with entity_refs) is decoded once in C, at the server,
    then parsed and converted in Python: the ingest does not give the same bytes to the C decoder a second time."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_ebpf.emit import otlp_in
    from tests.unit.receivers.test_otlp_server import grpc_raw_export

    assert otlp_in._DECODE is not None
    calls: list[int] = []
    real = otlp_in._DECODE

    def counting(raw: bytes) -> object:
        calls.append(len(raw))
        return real(raw)

    monkeypatch.setattr(otlp_in, "_DECODE", counting)
    ctx = Context(telemetry=GatewayTelemetry())
    out = ListConsumer()
    traces = BoundedQueue(out, ctx.telemetry, max_events=100, name="traces")
    ingest = OtlpIngest(ctx.telemetry, traces, BoundedQueue(ListConsumer(), ctx.telemetry, max_events=3))
    refs = encode_spans(make_spans())
    refs.resource_spans[0].resource.entity_refs.add(type="service")
    receiver = OtlpReceiver(OtlpReceiverConfig(grpc_endpoint="127.0.0.1:0", http_endpoint="", wait_for_room=0.0),
                            ctx, ingest)
    receiver.start()
    traces.start()
    try:
        assert grpc_raw_export(receiver.grpc_port, refs.SerializeToString()) is grpc.StatusCode.OK
    finally:
        receiver.shutdown()
        traces.shutdown()
    assert len(out.take()) == 2 and ctx.telemetry.get(RECEIVED) == 2
    assert calls == [len(refs.SerializeToString())]  # once, at the server
