"""Log records through the gateway: an agent's Emitter exports a LogRecord over OTLP/gRPC (real
sockets on 127.0.0.1) to the gateway's receiver; it passes the collective join unchanged and leaves
through the gateway's OTLP exporter to a sink, resource, scope and fields intact. Refusals and the
ExportGate count log records like spans."""
from __future__ import annotations

import time
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource

from otel_ebpf.core.events import LogRecord, SpanRecord
from otel_ebpf.core.pipeline import BoundedQueue, Context, ListConsumer
from otel_ebpf.core.telemetry import DROPPED, RECEIVED, REFUSED, Telemetry
from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.emit.exporters import BatchConfig, OtlpExporterConfig, build_exporters, build_log_exporter
from otel_ebpf.emit.logs import LogBuilder
from otel_ebpf.gateway import load
from otel_ebpf.gateway.ingest import OtlpIngest
from otel_ebpf.gateway.losses import GatewayTelemetry
from otel_ebpf.gateway.service import Gateway
from tests.support.otlp_sink import OtlpSink, decode_attrs

T0 = 1_700_000_000_000_000_000
TRACE = 0x0123456789ABCDEF0123456789ABCDEF
SPAN = 0x1122334455667788


def _agent(port: int) -> tuple[Emitter, Telemetry]:
    cfg = OtlpExporterConfig(endpoint=f"127.0.0.1:{port}", batch=BatchConfig(batch_delay=0.05))
    spans, metrics = build_exporters(cfg)
    tel = Telemetry()
    emitter = Emitter([ExporterSpec.of("otlp", spans, metrics, cfg, logs=build_log_exporter(cfg))], tel,
                      resource_of=lambda pid, comm: {"process.pid": pid, "process.executable.name": comm or "?",
                                                     "ml.rank": 3},
                      agent_attributes={"service.name": "otel-ebpf"}, extra_attributes={"host.name": "node-b"},
                      metrics_interval=3600.0)
    return emitter, tel


def _gateway(tmp_path: Path, sink: OtlpSink) -> Gateway:
    cfg_file = tmp_path / "gw.yaml"
    cfg_file.write_text("exporters:\n  otlp:\n    batch: {batch_delay: 50ms}\n"
                        "service:\n  metrics_interval: 1h\n  tick_interval: 20ms\n  health_endpoint: ''\n")
    cfg = load(str(cfg_file), endpoint=sink.grpc_endpoint, protocol="grpc", grpc_endpoint="127.0.0.1:0",
               http_endpoint="127.0.0.1:0")
    assert cfg.pipeline.processors == ["collective_join"]
    return Gateway(cfg)


def _logs(sink: OtlpSink) -> list[tuple[dict, str, object]]:
    return [(decode_attrs(rl.resource.attributes), sl.scope.name, rec)
            for request in sink.requests() for rl in getattr(request, "resource_logs", ())
            for sl in rl.scope_logs for rec in sl.log_records]


def test_a_log_record_goes_from_an_agent_through_the_gateway_to_the_collector(tmp_path):
    with OtlpSink() as sink:
        gw = _gateway(tmp_path, sink)
        gw.start()
        emitter, agent_tel = _agent(gw.endpoints()["otlp"][0])
        try:
            emitter.consume([
                LogRecord(pid=4242, time_ns=T0, event_name="otel_ebpf.nccl.rank.stack",
                          body='File "train.py", line 42, in step', attributes={"nccl.rank": 3, "ranks": (1, 2)},
                          severity="WARN", scope="otel_ebpf.hang", trace_id=TRACE, span_id=SPAN, comm="python"),
                SpanRecord(pid=4242, name="cudaMemcpy", start_ns=T0, end_ns=T0 + 10, attributes={}),
                LogRecord(pid=None, time_ns=T0 + 1, event_name="otel_ebpf.nccl.straggler", body="rank 3",
                          attributes={}, severity="ERROR")])
            assert emitter.flush(10.0)
            assert sink.wait_for(lambda: len(_logs(sink)) == 2 and sink.spans(), timeout=15), sink.requests()
        finally:
            emitter.shutdown()
            gw.shutdown()
        logs = sorted(_logs(sink), key=lambda r: r[2].time_unix_nano)
    (res, scope, stack), (agent_res, agent_scope, straggler) = logs
    mine = ("process.pid", "process.executable.name", "ml.rank", "host.name")
    assert {k: res.get(k) for k in mine} == {"process.pid": 4242, "process.executable.name": "python", "ml.rank": 3,
                                            "host.name": "node-b"}
    (span_res, _, _), = sink.spans()
    assert span_res == res  # the log's resource is the one that pid's spans get, through the gateway too
    assert scope == "otel_ebpf.hang" and agent_scope == "otel_ebpf"
    assert (stack.event_name, stack.severity_text, stack.severity_number, stack.body.string_value) == \
        ("otel_ebpf.nccl.rank.stack", "WARN", 13, 'File "train.py", line 42, in step')
    assert decode_attrs(stack.attributes) == {"nccl.rank": 3, "ranks": [1, 2]}
    assert (int.from_bytes(stack.trace_id, "big"), int.from_bytes(stack.span_id, "big"), stack.flags) == \
        (TRACE, SPAN, 1)
    assert stack.time_unix_nano == T0 and stack.observed_time_unix_nano >= T0
    assert agent_res["service.name"] == "otel-ebpf" and "process.pid" not in agent_res
    assert (straggler.event_name, straggler.severity_number, straggler.trace_id) == ("otel_ebpf.nccl.straggler", 17,
                                                                                     b"")
    summary = gw.summary()
    assert summary["logs"] == 2 and summary["spans"] == 1 and summary["dropped"] == 0 and summary["lost"] == 0
    assert gw.receivers["otlp"].stats.log_records == 2
    assert agent_tel.get(DROPPED) == 0


def _request(n: int):
    build = LogBuilder().build
    return encode_logs([build(LogRecord(pid=1, time_ns=T0 + i, event_name="e", body=str(i), attributes={}),
                              Resource({"process.pid": 1})) for i in range(n)])


def test_log_records_share_the_pipeline_queue_and_a_request_that_does_not_fit_is_refused_whole():
    tel = GatewayTelemetry()
    out = ListConsumer()
    traces = BoundedQueue(out, tel, max_events=3, name="traces")
    ingest = OtlpIngest(tel, traces, BoundedQueue(ListConsumer(), tel, max_events=3, name="metrics"))
    request = _request(2)
    request.resource_logs[0].scope_logs[0].log_records.add(trace_id=b"\x01" * 5)  # malformed: counted
    assert ingest.offer([request])
    assert tel.get(RECEIVED, receiver="otlp") == 2 and tel.get(DROPPED, reason="malformed_log") == 1
    assert not ingest.offer([_request(2)])  # 2 of 3 taken: a request of 2 more does not fit
    assert tel.get(REFUSED, receiver="otlp", signal="logs") == 2 and tel.get(RECEIVED) == 2
    traces.start()
    try:
        deadline = time.monotonic() + 5
        while len(out.events) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        traces.shutdown()
    assert all(isinstance(e, ReadableLogRecord) for e in out.take())


def test_the_export_gate_waits_for_room_in_the_log_queues_too(tmp_path):
    with OtlpSink() as sink:
        gw = _gateway(tmp_path, sink)
        try:
            queues = gw.gate._queues()
            assert {q.signal for q in queues} == {"spans", "logs"}
        finally:
            gw.shutdown()


def test_the_collective_join_passes_received_log_records_on_unchanged():
    from otel_ebpf.processors import collective_join

    out = ListConsumer()
    ctx = Context(telemetry=Telemetry())
    join = collective_join.factory.create(collective_join.factory.config_class(), ctx, out)
    join.start()
    try:
        rec = LogBuilder().build(LogRecord(pid=1, time_ns=T0, event_name="e", body="b", attributes={}),
                                 Resource({"process.pid": 1}))
        join.consume([rec])
        assert rec in out.take()
    finally:
        join.shutdown()


class _StubEmitter:
    """What the Forwarder hands on, by way."""

    def __init__(self) -> None:
        self.spans: list = []
        self.logs: list = []
        self.other: list = []

    def export_spans(self, spans) -> None:
        self.spans += spans

    def export_logs(self, logs) -> None:
        self.logs += logs

    def consume(self, events) -> None:
        self.other += events


def test_the_gateways_own_log_records_count_as_log_records_out_like_received_ones():
    from otel_ebpf.core.events import Tick
    from otel_ebpf.emit.forward import Forwarder

    emitter = _StubEmitter()
    fwd = Forwarder(emitter, [], Telemetry())  # type: ignore[arg-type]
    received = LogBuilder().build(LogRecord(pid=1, time_ns=T0, event_name="otel_ebpf.nccl.rank.stack", body="b",
                                            attributes={}), Resource({"process.pid": 1}))
    own = LogRecord(pid=None, time_ns=T0, event_name="otel_ebpf.nccl.desync", body="NCCL desync", attributes={})
    fwd.consume([received, own, Tick(T0)])
    assert emitter.logs == [received] and emitter.other == [own, Tick(T0)]
    assert fwd.logs_forwarded == 2 and fwd.spans_forwarded == 0  # the summary's "log records out"
