"""Every component the gateway registers, with its default config: created, shut down without
start, started, shut down twice (STYLE.md: one parametrized lifecycle test; the agent's is
tests/bpf/test_component_lifecycle.py). The OTLP receiver as a component: what it hands on."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_ebpf.core.pipeline import Context, Factory, ListConsumer
from otel_ebpf.gateway import components
from otel_ebpf.gateway.losses import GatewayTelemetry
from otel_ebpf.receivers import otlp
from tests.unit.receivers.test_otlp_server import make_spans

_FREE_PORTS = {"otlp": {"grpc_endpoint": "127.0.0.1:0", "http_endpoint": "127.0.0.1:0"}}


def _registered() -> list[tuple[str, Factory]]:
    return ([(f"receiver/{t}", f) for t, f in components.receivers().items()]
            + [(f"processor/{t}", f) for t, f in components.processors().items()])


def test_the_gateway_registry_lists_receiver_factories():
    assert components.receivers()["otlp"] is otlp.factory and otlp.factory.config_class is otlp.Config


@pytest.mark.parametrize("name,factory", _registered(), ids=[n for n, _ in _registered()])
def test_gateway_component_lifecycle(name, factory):
    ctype = name.split("/")[1]
    assert factory.type == ctype and factory.description
    cfg = dataclasses.replace(factory.config_class(), **_FREE_PORTS.get(ctype, {}))  # defaults, no fixed port
    cfg.validate(ctype)
    ctx = Context(telemetry=GatewayTelemetry())
    fresh = factory.create(cfg, ctx, ListConsumer())
    fresh.shutdown()  # safe without start
    fresh.shutdown()
    comp = factory.create(cfg, ctx, ListConsumer())
    try:
        comp.start()
    finally:
        comp.shutdown()
        comp.shutdown()  # safe twice


def _receiver(next_) -> otlp.OtlpReceiver:
    cfg = otlp.Config(grpc_endpoint="", http_endpoint="127.0.0.1:0", wait_for_room=0.0, retry_after=0.001)
    return otlp.factory.create(cfg, Context(), next_)


def _export(port: int) -> SpanExportResult:
    exporter = HttpSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=2)
    try:
        return exporter.export(make_spans())
    finally:
        exporter.shutdown()


def test_a_plain_consumer_gets_each_decoded_request():
    sink = ListConsumer()
    receiver = _receiver(sink)
    receiver.start()
    try:
        assert _export(receiver.http_port) == SpanExportResult.SUCCESS
    finally:
        receiver.shutdown()
    [request] = sink.take()
    assert isinstance(request, ExportTraceServiceRequest)
    assert [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans] == ["child", "parent"]


class Refusing(ListConsumer):
    """Refuses the first ``n`` offers, then takes everything; records each ``block_s``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.waits = n, []

    def offer(self, events: Sequence[object], *, block_s: float = 0.0) -> bool:
        self.waits.append(block_s)
        if self.n > 0:
            self.n -= 1
            return False
        self.consume(events)
        return True


def test_an_offering_stage_that_refuses_gets_the_request_again_and_keeps_it_once():
    sink = Refusing(1)
    receiver = _receiver(sink)
    assert isinstance(sink, otlp.Offering)
    receiver.start()
    try:
        assert _export(receiver.http_port) == SpanExportResult.SUCCESS  # the SDK retries after the 503
    finally:
        receiver.shutdown()
    assert receiver.stats.refused == 1 and len(sink.take()) == 1 and sink.waits == [0.0, 0.0]
