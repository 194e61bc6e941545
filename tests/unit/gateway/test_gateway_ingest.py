"""The gateway's ingest under pressure: its OTLP receiver refuses a request whole when the queue has
no room (the real SDK exporters retry it, it lands once), and the ExportGate holds the pipeline
while an exporter's queue is full."""
from __future__ import annotations

import threading
import time

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
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
