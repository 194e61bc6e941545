"""OtlpServer refusing requests it has no room for: UNAVAILABLE / 503 with a retry hint, and the
real SDK OTLP exporters (1.45) retrying the whole request after that hint, over loopback sockets."""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.metrics.export import MetricExportResult
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_ebpf.core.errors import ConfigError
from otel_ebpf.receivers.otlp import OtlpServer, count_items
from tests.support.otlp_sink import spans_of
from tests.unit.receivers.test_otlp_server import TRACE_METHOD, make_metrics, make_spans, post


class Door:
    """A callback that refuses its first ``refusals`` requests (as a full queue would), then keeps
    every request; records when each call came."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.calls: list[float] = []
        self.kept: list[object] = []
        self._lock = threading.Lock()

    def __call__(self, request: object) -> bool:
        with self._lock:
            self.calls.append(time.monotonic())
            if len(self.calls) <= self.refusals:
                return False
            self.kept.append(request)
            return True

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.calls, self.calls[1:], strict=False)]


def serve(door: Door, retry_after: float) -> OtlpServer:
    return OtlpServer(grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0", on_traces=door,
                      on_metrics=door, retry_after=retry_after)


def test_grpc_span_exporter_retries_after_the_hint_and_delivers_once():
    door = Door(refusals=2)
    with serve(door, retry_after=0.2) as server:
        exporter = GrpcSpanExporter(endpoint=f"http://127.0.0.1:{server.grpc_port}", insecure=True, timeout=10)
        spans = make_spans()
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        exporter.shutdown()
        stats = server.stats
    assert len(door.calls) == 3 and stats.refused == 2 and stats.requests == 3
    # the SDK's own backoff would wait 1 s (+-20 %) then 2 s: these gaps are the server's 0.2 s hint
    # (plus a channel reconnect after the first UNAVAILABLE)
    assert all(0.15 <= gap < 0.75 for gap in door.gaps()), door.gaps()
    rows = spans_of(door.kept)
    assert sorted(s.span_id for _, _, s in rows) == sorted(s.context.span_id.to_bytes(8, "big") for s in spans)
    assert stats.spans == len(spans) == 2  # refused requests are not counted as received


def test_http_span_exporter_retries_after_retry_after_and_delivers_once():
    door = Door(refusals=2)
    with serve(door, retry_after=1.0) as server:
        exporter = HttpSpanExporter(endpoint=f"http://127.0.0.1:{server.http_port}/v1/traces", timeout=10)
        assert exporter.export(make_spans()) is SpanExportResult.SUCCESS
        exporter.shutdown()
        stats = server.stats
    assert len(door.calls) == 3 and stats.refused == 2
    # Retry-After: 1 for both retries; the SDK's own backoff would make the second gap 2 s +-20 %
    assert all(0.9 <= gap < 1.5 for gap in door.gaps()), door.gaps()
    assert len(spans_of(door.kept)) == 2 and stats.spans == 2


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_metric_exporters_retry_a_refused_request_whole(transport):
    door = Door(refusals=1)
    with serve(door, retry_after=0.2) as server:
        if transport == "grpc":
            exporter = GrpcMetricExporter(endpoint=f"http://127.0.0.1:{server.grpc_port}", insecure=True,
                                          timeout=10)
        else:
            exporter = HttpMetricExporter(endpoint=f"http://127.0.0.1:{server.http_port}/v1/metrics", timeout=10)
        assert exporter.export(make_metrics()) is MetricExportResult.SUCCESS
        exporter.shutdown()
        stats = server.stats
    assert stats.refused == 1 and len(door.kept) == 1
    assert count_items(door.kept[0]) == stats.metric_points == 2


def test_exporter_gives_up_within_its_timeout_while_refused():
    door = Door(refusals=10**6)
    with serve(door, retry_after=0.5) as server:
        exporter = GrpcSpanExporter(endpoint=f"http://127.0.0.1:{server.grpc_port}", insecure=True, timeout=2)
        t0 = time.monotonic()
        assert exporter.export(make_spans()) is SpanExportResult.FAILURE
        took = time.monotonic() - t0
        exporter.shutdown()
        stats = server.stats
    assert took < 3.0 and stats.refused == len(door.calls) >= 3 and door.kept == []


def test_refusal_carries_retry_info_on_both_transports():
    door = Door(refusals=10**6)
    with serve(door, retry_after=2.5) as server:
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            with pytest.raises(grpc.RpcError) as caught:
                channel.unary_unary(TRACE_METHOD)(b"", timeout=5)
        status, reply = post(f"http://127.0.0.1:{server.http_port}/v1/traces", b"{}", "application/json")
    err = caught.value
    assert err.code() is grpc.StatusCode.UNAVAILABLE
    trailers = dict(err.trailing_metadata())
    details = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    assert details.code == grpc.StatusCode.UNAVAILABLE.value[0]
    info = error_details_pb2.RetryInfo()
    assert details.details[0].Unpack(info) and info.retry_delay.ToNanoseconds() == 2_500_000_000
    assert error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"]) == info
    body = json.loads(reply)
    assert status == 503 and body["code"] == 14 and body["details"][0]["retryDelay"] == "2.500s"


def test_http_retry_after_is_whole_seconds_rounded_up():
    door = Door(refusals=10**6)
    with serve(door, retry_after=0.3) as server:
        request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/traces", data=b"",
                                         headers={"Content-Type": "application/x-protobuf"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 503 and caught.value.headers["Retry-After"] == "1"
    assert server.stats.refused == 1


@pytest.mark.parametrize("bad", [0, -1, 7200])
def test_retry_after_is_validated(bad):
    with pytest.raises(ConfigError, match="retry_after"):
        OtlpServer(on_traces=lambda r: None, retry_after=bad)
