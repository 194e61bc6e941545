"""``otel-ebpf gateway`` as a user runs it: OTLP over real sockets in, joined traces out.

Two "agents" (SDK OTLP exporters with resources host.name=node-a / node-b) send the rank spans
of 4 ranks x 3 collectives; rank 3 is 30 ms late. Then the same spans, routed by trace id over
two gateways (as the Collector's loadbalancing exporter would), must join identically.
No root, no BCC: these run anywhere.
"""
from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.support.nccl_spans import node, rank_span, root_span
from tests.support.otlp_sink import OtlpSink, decode_attrs

ROOT = Path(__file__).resolve().parents[2]
LATE_NS = 30_000_000
COLLECTIVES = 3
COMM = "0123456789abcdef"  # its collectives 0-2 have odd and even trace ids: both shards get work
pytestmark = pytest.mark.timeout(120)


@contextmanager
def gateway(tmp_path: Path, sink: OtlpSink, name: str = "gw") -> Iterator[tuple[int, Path]]:
    """A gateway subprocess on free loopback ports exporting to ``sink``; yields its gRPC port and
    its stderr file. Stopped with SIGTERM on exit, which must flush and exit 0."""
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text("processors:\n  collective_join: {timeout: 3s, desync_timeout: 1s}\n"
                   "exporters:\n  otlp:\n    batch: {batch_delay: 50ms}\n"
                   "service:\n  metrics_interval: 200ms\n  tick_interval: 20ms\n")
    cfg.chmod(0o600)
    err = open(tmp_path / f"{name}.stderr", "w+")  # closed in the finally below
    proc = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "gateway", "--config", str(cfg),
                             "--grpc-endpoint", "127.0.0.1:0", "--http-endpoint", "127.0.0.1:0",
                             "--otlp-endpoint", sink.grpc_endpoint, "--otlp-protocol", "grpc"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        try:
            line = lines.get(timeout=30)
        except queue.Empty:
            proc.kill()
            pytest.fail(f"gateway did not start in 30s: {(tmp_path / f'{name}.stderr').read_text()}")
        m = re.search(r"grpc=(\d+)", line)
        assert m, line
        yield int(m.group(1)), tmp_path / f"{name}.stderr"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait(timeout=10)
        err.seek(0)
        stderr = err.read()
        err.close()
    assert rc == 0, stderr
    assert "otel-ebpf gateway:" in stderr and "Traceback" not in stderr, stderr
    # a line per exporter, as the agent's summary has: where it sent to, what, and any loss
    assert re.search(rf"otel-ebpf gateway: exporter otlp -> {re.escape(sink.grpc_endpoint)}: sent ", stderr), stderr


def agent_spans(t0: int) -> dict[str, list[ReadableSpan]]:
    """node-a: ranks 0-1 and rank 0's roots; node-b: ranks 2-3, rank 3 starting 30 ms late."""
    out: dict[str, list[ReadableSpan]] = {"node-a": [], "node-b": []}
    for seq in range(COLLECTIVES):
        base = t0 + seq * 100_000_000
        out["node-a"] += [root_span(seq, base, dur=2_000_000, comm=COMM),
                          rank_span(seq, 0, base, dur=2_000_000, comm=COMM),
                          rank_span(seq, 1, base + 1000, dur=2_000_000, comm=COMM)]
        out["node-b"] += [rank_span(seq, 2, base + 2000, dur=2_000_000, comm=COMM),
                          rank_span(seq, 3, base + LATE_NS, dur=2_000_000, comm=COMM)]
    return out


def send(port: int, spans: Sequence[ReadableSpan]) -> None:
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}", insecure=True, timeout=10)
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()


def run_agents(ports: Sequence[int], spans_by_node: dict[str, list[ReadableSpan]]) -> None:
    """Each node's spans to the gateway ``ports[trace_id % len(ports)]``; node-b 30 ms later."""
    for host in ("node-a", "node-b"):
        if host == "node-b":
            time.sleep(LATE_NS / 1e9)
        routed: dict[int, list[ReadableSpan]] = defaultdict(list)
        for span in spans_by_node[host]:
            routed[ports[span.context.trace_id % len(ports)]].append(span)
        for port, spans in routed.items():
            send(port, spans)


def traces(sink: OtlpSink) -> dict[bytes, list[tuple[dict, object]]]:
    out: dict[bytes, list[tuple[dict, object]]] = defaultdict(list)
    for resource, _scope, span in sink.spans():
        out[span.trace_id].append((resource, span))
    return out


def wait_for_joined(sink: OtlpSink) -> dict[bytes, list[tuple[dict, object]]]:
    ok = sink.wait_for(lambda: sum(len(v) for v in traces(sink).values()) >= COLLECTIVES * 5, timeout=20)
    assert ok, f"only {len(sink.spans())} spans arrived"
    return traces(sink)


def canonical(joined: dict[bytes, list[tuple[dict, object]]]) -> list[tuple]:
    return sorted((span.trace_id, span.span_id, span.parent_span_id, span.name, span.start_time_unix_nano,
                   span.end_time_unix_nano, tuple(sorted((k, repr(v)) for k, v in decode_attrs(span.attributes)
                                                         .items())), resource.get("host.name"))
                  for spans in joined.values() for resource, span in spans)


def test_gateway_joins_every_collective_across_two_nodes(tmp_path):
    with OtlpSink() as sink:
        with gateway(tmp_path, sink) as (port, _):
            run_agents([port], agent_spans(time.time_ns()))
            reader = InMemoryMetricReader()  # an agent's metric passes through unchanged
            meters = MeterProvider(resource=node("node-a"), metric_readers=[reader])
            meters.get_meter("otel_ebpf.nccl").create_counter("nccl.calls").add(12, {"nccl.op": "AllReduce"})
            exporter = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{port}", insecure=True, timeout=10)
            exporter.export(reader.get_metrics_data())
            exporter.shutdown()
            joined = wait_for_joined(sink)
            assert sink.wait_for(lambda: {"nccl.calls", "nccl.join.released", "nccl.straggler.count",
                                          "nccl.collective.skew"} <= sink.metric_names(), timeout=10)
    assert len(joined) == COLLECTIVES
    for spans in joined.values():
        assert len(spans) == 5, [s.name for _, s in spans]
        ids = {s.span_id for _, s in spans}
        assert all(s.parent_span_id in ids for _, s in spans if s.parent_span_id)  # every parent resolves
        (root,) = [(r, s) for r, s in spans if not s.parent_span_id]
        attrs = decode_attrs(root[1].attributes)
        assert root[0]["host.name"] == "node-a"  # rank 0's own root span, extended
        assert attrs["nccl.straggler.rank"] == 3 and attrs["nccl.straggler.host"] == "node-b"
        assert attrs["nccl.skew_ns"] == LATE_NS and attrs["nccl.ranks.arrived"] == 4
        assert "nccl.partial" not in attrs
        waits = {decode_attrs(s.attributes)["nccl.rank"]: decode_attrs(s.attributes)["nccl.wait_ns"]
                 for _, s in spans if s.parent_span_id}
        assert waits == {0: LATE_NS, 1: LATE_NS - 1000, 2: LATE_NS - 2000, 3: 0}
        assert {r["host.name"] for r, s in spans if s.parent_span_id} == {"node-a", "node-b"}
    calls = [m for r, m in sink.metrics() if m.name == "nccl.calls"]
    assert calls and calls[0].sum.data_points[0].as_int == 12


def test_two_gateways_sharded_by_trace_id_join_like_one(tmp_path):
    t0 = time.time_ns()
    with OtlpSink() as single:
        with gateway(tmp_path, single, "single") as (port, _):
            run_agents([port], agent_spans(t0))
            one = canonical(wait_for_joined(single))
    with OtlpSink() as sharded:
        with gateway(tmp_path, sharded, "gw0") as (p0, _), gateway(tmp_path, sharded, "gw1") as (p1, _):
            run_agents([p0, p1], agent_spans(t0))
            two = canonical(wait_for_joined(sharded))
    assert len(one) == COLLECTIVES * 5
    assert {int.from_bytes(row[0], "big") % 2 for row in one} == {0, 1}  # both gateways joined some
    assert two == one


def test_hang_is_reported_while_it_lasts_then_released_as_partial(tmp_path):
    t0 = time.time_ns()
    with OtlpSink() as sink:
        with gateway(tmp_path, sink) as (port, stderr):
            send(port, [rank_span(0, r, t0, comm=COMM) for r in range(4)])  # one good collective
            send(port, [rank_span(1, r, t0 + 10**8, comm=COMM) for r in range(3)])  # rank 3 hangs
            assert sink.wait_for(lambda: "nccl.desync.count" in sink.metric_names(), timeout=10)
            assert "for ranks 3 of 4" in stderr.read_text()  # logged live, naming the missing rank
            assert sink.wait_for(lambda: len(traces(sink)) == 2 and len(sink.spans()) == 9, timeout=10)
    (root,) = [s for _, _, s in sink.spans() if not s.parent_span_id and decode_attrs(s.attributes)["nccl.seq"] == 1]
    attrs = decode_attrs(root.attributes)
    assert attrs["nccl.partial"] is True and attrs["nccl.missing_ranks"] == [3]
    (event,) = root.events
    assert event.name == "nccl.desync" and decode_attrs(event.attributes)["nccl.last_seq"] == [1, 1, 1, 0]
