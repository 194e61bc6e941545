"""The gateway's decoder caches (one Resource and one scope object per distinct bytes, bounded at 4,096 each and
cleared whole when full: emit/_otlpdec.c) count what their clears drop, as every bounded cache does:
``otel_ebpf.cache.evictions{cache=otlp_resources|otlp_scopes, reason=full}``. Agents' OTLP requests over real gRPC
(127.0.0.1) to a started gateway."""
from __future__ import annotations

import time
from pathlib import Path

import grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags

from otel_ebpf.core.telemetry import CACHE_EVICTIONS
from otel_ebpf.emit import otlp_in
from otel_ebpf.emit.otlp_proto import spans_to_otlp_proto
from tests.unit.gateway.test_gateway_logs import _gateway
from tests.support.otlp_sink import OtlpSink

_TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
T0 = 1_700_000_000_000_000_000


def _requests(hosts: int, per_request: int) -> list[bytes]:
    """One span of each of ``hosts`` resources (host.name node-i), each with a scope of its own version."""
    spans = [ReadableSpan(f"step {i}", context=SpanContext(i + 1, i + 1, False, TraceFlags(1)),
                          resource=Resource({"host.name": f"node-{i}", "service.name": "train"}),
                          instrumentation_scope=InstrumentationScope("train", str(i)), start_time=T0, end_time=T0 + 1)
             for i in range(hosts)]
    return [spans_to_otlp_proto(spans[i:i + per_request]) for i in range(0, hosts, per_request)]


def test_the_decoders_cache_clears_are_counted_as_evictions(tmp_path: Path) -> None:
    assert otlp_in.NATIVE, "the C decoder did not build"
    with OtlpSink() as sink:
        gw = _gateway(tmp_path, sink)
        gw.start()
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{gw.endpoints()['otlp'][0]}")
            call = channel.unary_unary(_TRACES, request_serializer=None, response_deserializer=None)
            for body in _requests(5_000, 500):  # 5,000 distinct resources and scopes: past the 4,096 of each
                call(body, timeout=30)
            channel.close()
            tel = gw.ctx.telemetry
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not (tel.get(CACHE_EVICTIONS, cache="otlp_resources")
                                                       and tel.get(CACHE_EVICTIONS, cache="otlp_scopes")):
                time.sleep(0.02)
            for cache in ("otlp_resources", "otlp_scopes"):
                n = tel.get(CACHE_EVICTIONS, cache=cache, reason="full")
                assert n >= 4_096 and n % 4_096 == 0, (cache, n)  # each clear drops the 4,096 it held
        finally:
            gw.shutdown()
