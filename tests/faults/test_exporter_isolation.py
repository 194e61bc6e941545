"""One exporter's collector is blackholed for 60 s; the agent's other exporters must not notice.

A real agent (``otel-ebpf run``) traces ``tests/support/cuda_loop.py`` (one ``cudaMemcpy`` per
5 ms) with three exporters: ``otlp`` to a gRPC endpoint that is a blackhole (a loopback socket
that accepts connections and never answers: every export waits for its 10 s timeout),
``otlp/sink`` to a healthy OTLP sink, and ``prometheus``. Metrics every 2 s.

Asserted, while the blackhole lasts: metric collections keep reaching the sink and the
Prometheus page keeps changing with no gap of two metrics intervals (no collection missed),
spans keep reaching the sink, and the pipeline drops nothing. After it lifts (a real OTLP
server on the same port): spans queued and retried during the blackhole arrive, and for each
OTLP exporter every call is a span it delivered or a counted drop
(``otel_ebpf.events.dropped`` of the call path and of that exporter). Printed (``-s``): the
largest metric gaps at the sink and the Prometheus page, spans and drops per exporter, the
delay of the first spans after the lift. ``--soak`` makes the blackhole 300 s.
"""
from __future__ import annotations

import socket
import threading
import time
import urllib.request
from itertools import pairwise

import psutil
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ebpf.receivers.otlp.server import OtlpServer
from tests.faults.agentproc import agent, drops_by_reason, loop_calls, loop_cmd, wait_until
from tests.support.otlp_sink import OtlpSink, metrics_of, spans_of

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(900)]
INTERVAL = 2.0  # service.metrics_interval
UPSTREAM = ("cuda", "default", "emit")  # drops of the call path before the exporters


class Blackhole:
    """A TCP listener on loopback that accepts every connection and never answers (a collector
    behind a dead route, or hung). ``lift()`` closes it and serves real OTLP/gRPC on the port."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.requests: list[object] = []
        self.first_spans_at: float | None = None
        self.server: OtlpServer | None = None
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self._conns.append(conn)  # held open, never read: the client waits for its deadline

    def _keep(self, request: object) -> None:
        with self._lock:
            if self.first_spans_at is None and getattr(request, "resource_spans", None):
                self.first_spans_at = time.monotonic()
            self.requests.append(request)

    def lift(self) -> float:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._sock.close()
        server = OtlpServer(grpc_endpoint=f"127.0.0.1:{self.port}", http_endpoint=None,
                            on_traces=self._keep, on_metrics=self._keep)
        server.start()
        self.server = server
        return time.monotonic()

    def snapshot(self) -> list[object]:
        with self._lock:
            return list(self.requests)

    def close(self) -> None:
        if self.server is None:
            self._stop.set()
            self._sock.close()
            for conn in self._conns:
                conn.close()
        else:
            self.server.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prometheus_sample(port: int) -> str | None:
    """The value lines of the CUDA receiver's event counter (changes with every collection)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            page = r.read().decode()
    except OSError:
        return None
    return "\n".join(line for line in page.splitlines() if line.startswith("otel_ebpf_events_received_total"))


def _metric_requests(sink: OtlpSink) -> list[ExportMetricsServiceRequest]:
    return [r for r in sink.requests() if isinstance(r, ExportMetricsServiceRequest)]


def _counts(sink: OtlpSink) -> tuple[int, int]:
    """(metric requests, span requests) received so far: cheap enough to poll every 0.1 s."""
    requests = sink.requests()
    metrics = sum(isinstance(r, ExportMetricsServiceRequest) for r in requests)
    return metrics, len(requests) - metrics


def _reconcile(calls: int, spans: int, drops: dict[str, int], exporter: str) -> tuple[int, int]:
    """(drops of the call path upstream of the exporters, drops of ``exporter``)."""
    up = sum(v for k, v in drops.items() if k.split("/")[0] in UPSTREAM)
    own = sum(v for k, v in drops.items() if k.rsplit("/", 1)[0] == exporter)
    assert calls <= spans + up + own <= calls + 10, (exporter, calls, spans, drops)
    return up, own


@pytest.mark.idle_window
def test_blackholed_exporter_delays_no_other_exporter(bpf_ready, cudart, tmp_path, soak):
    blackhole_s = 300 if soak else 60
    hole, sink = Blackhole(), OtlpSink(max_requests=100_000).start()
    prom = _free_port()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        "exporters:\n"
        f"  otlp:\n    endpoint: http://127.0.0.1:{hole.port}\n"
        f"  otlp/sink:\n    endpoint: {sink.grpc_endpoint}\n    batch: {{batch_delay: 0.5}}\n"
        f"  prometheus:\n    endpoint: '127.0.0.1:{prom}'\n"
        f"service:\n  metrics_interval: {INTERVAL}s\n"
        "  pipelines:\n    default:\n      exporters: [otlp, otlp/sink, prometheus]\n")
    cfg.chmod(0o600)
    err = tmp_path / "agent.err"
    proc = agent("run", "--config", str(cfg), "--",
                 *loop_cmd(cudart, tmp_path, sleep_ms=5, max_s=blackhole_s + 300), stderr=err)
    metric_at: list[float] = []   # when a new metrics request reached the sink
    prom_at: list[float] = []     # when the Prometheus page changed
    span_at: list[float] = []     # when a new span request reached the sink
    rss: list[int] = []
    try:
        ps = psutil.Process(proc.pid)
        assert wait_until(lambda: sink.spans() and _prometheus_sample(prom), 90), err.read_text()
        start = time.monotonic()
        (n_metrics, n_spans), page = _counts(sink), _prometheus_sample(prom)
        while time.monotonic() - start < blackhole_s:  # the blackhole holds the otlp exporter
            assert proc.poll() is None, err.read_text()
            now = time.monotonic()
            m, s = _counts(sink)
            if m > n_metrics:
                metric_at.append(now)
            if s > n_spans:
                span_at.append(now)
            n_metrics, n_spans = m, s
            if (p := _prometheus_sample(prom)) is not None and p != page:
                prom_at.append(now)
                page = p
            if len(rss) < (now - start):
                rss.append(ps.memory_info().rss)
            time.sleep(0.1)
        end = time.monotonic()
        lifted_at = hole.lift()
        assert wait_until(lambda: hole.first_spans_at is not None, 120), "export never resumed after the lift"
        time.sleep(5)  # some tracing after the lift
        (tmp_path / "stop").touch()
        assert proc.wait(timeout=300) == 0, err.read_text()
    finally:
        (tmp_path / "stop").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        hole.close()
        sink.shutdown()

    def gaps(times: list[float]) -> list[float]:
        return [b - a for a, b in pairwise([start, *times, end])]

    calls = loop_calls(tmp_path)
    drops = drops_by_reason(metrics_of(_metric_requests(sink)), receivers=(*UPSTREAM, "otlp", "otlp/sink"))
    sink_spans = [s for _, _, s in sink.spans() if s.name == "cudaMemcpy"]
    hole_spans = [s for _, _, s in spans_of(hole.snapshot()) if s.name == "cudaMemcpy"]
    up, own_hole = _reconcile(calls, len(hole_spans), drops, "otlp")
    _, own_sink = _reconcile(calls, len(sink_spans), drops, "otlp/sink")
    print(f"\nblackhole {blackhole_s}s, metrics every {INTERVAL}s: largest gap sink metrics "
          f"{max(gaps(metric_at)):.2f}s ({len(metric_at)} requests), Prometheus page {max(gaps(prom_at)):.2f}s "
          f"({len(prom_at)} changes), sink spans {max(gaps(span_at)):.2f}s; calls={calls} "
          f"otlp/sink spans={len(sink_spans)} drops={own_sink}; otlp (blackholed) spans={len(hole_spans)} "
          f"drops={own_hole}; upstream drops={up}; drops={drops}; first spans {hole.first_spans_at - lifted_at:.1f}s "
          f"after the lift; RSS {rss[0] / 2**20:.0f} -> max {max(rss) / 2**20:.0f} MiB")
    # no collection missed: consecutive arrivals closer than two intervals (plus the 0.1 s poll)
    assert max(gaps(metric_at)) < 2 * INTERVAL + 0.2, [round(g, 1) for g in gaps(metric_at)]
    assert max(gaps(prom_at)) < 2 * INTERVAL + 0.2, [round(g, 1) for g in gaps(prom_at)]
    assert max(gaps(span_at)) < 2 * INTERVAL + 0.2, [round(g, 1) for g in gaps(span_at)]  # batch_delay 0.5 s
    assert up == 0 and own_sink == 0, drops  # the pipeline and the healthy exporter lost nothing
    assert len(hole_spans) > 0 and (max(rss) - rss[0]) / 2**20 < 200
