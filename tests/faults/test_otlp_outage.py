"""The OTLP endpoint goes away for 60 s while the agent traces, then comes back on the same port.

Asserted: the agent stays alive throughout, its RSS stays bounded (sampled every second), the
spans it could not send are counted (``otel_ebpf.events.dropped`` with reason
``export_queue_full`` / ``export_failed`` / ``queue_full`` ...) and those counters reach the
collector once it is back, spans made after the outage arrive, and every call the workload made
is either an exported span or a counted drop, and the first spans reach the collector within
``RECOVERY_S`` of its return. Printed (``-s``): the export stall after the endpoint returned, RSS,
drops by reason. ``--soak`` makes the outage 300 s.
"""
from __future__ import annotations

import socket
import threading
import time

import psutil
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ebpf.receivers.otlp.server import OtlpServer
from tests.faults.agentproc import agent, drops_by_reason, loop_calls, loop_cmd, wait_until
from tests.support.otlp_sink import metrics_of, spans_of

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(900)]
QUEUE = 256  # exporter queue (spans): small, so the outage overflows it
# First spans at the returned collector within this (issue 7). With the default
# exporters.otlp.reconnect_backoff_max (5 s) the stall was 4.1 and 4.8 s in two runs of this test (1.8-2.4 s
# in 3 runs with the collector in a separate process); the bound is the worst case (an attempt every
# <= 6 s, then the SDK's retry sleep of <= 4 s) plus 2 s for the shared CPUs, 2.5x the worst measured.
# grpc's own 120 s backoff gave 3.8-28.1 s (6 runs): most regressions fail here, all fail
# test_export_failures.py::test_grpc_reconnect_attempts_stay_bounded_while_the_collector_is_down.
RECOVERY_S = 12.0


class Collector:
    """A real OTLP/gRPC endpoint on a fixed port that can go down and come back."""

    def __init__(self, port: int) -> None:
        self.port, self._lock = port, threading.Lock()
        self.requests: list[object] = []
        self.server: OtlpServer | None = None
        self.first_after_start: float | None = None

    def _keep(self, request) -> None:
        with self._lock:
            if self.first_after_start is None and getattr(request, "resource_spans", None):
                self.first_after_start = time.monotonic()
            self.requests.append(request)

    def start(self) -> float:
        self.first_after_start = None
        server = OtlpServer(grpc_endpoint=f"127.0.0.1:{self.port}", http_endpoint=None,
                            on_traces=self._keep, on_metrics=self._keep)
        server.start()
        self.server = server
        return time.monotonic()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None

    def snapshot(self) -> list:
        with self._lock:
            return list(self.requests)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _drops(requests) -> dict[str, int]:
    return drops_by_reason(metrics_of([r for r in requests if isinstance(r, ExportMetricsServiceRequest)]))


@pytest.mark.idle_window
def test_collector_down_60s_then_back(bpf_ready, cudart, tmp_path, soak):
    outage_s = 300 if soak else 60
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"exporters:\n  otlp:\n    batch:\n      queue_size: {QUEUE}\n      batch_size: 64\n"
                   "      batch_delay: 0.5\nservice:\n  metrics_interval: 2s\n")
    cfg.chmod(0o600)
    collector = Collector(_free_port())
    collector.start()
    proc = agent("run", "--config", str(cfg), "--otlp-endpoint", f"http://127.0.0.1:{collector.port}", "--",
                 *loop_cmd(cudart, tmp_path, sleep_ms=5, max_s=outage_s + 200), stderr=tmp_path / "agent.err")
    rss: list[int] = []
    try:
        ps = psutil.Process(proc.pid)
        assert wait_until(lambda: spans_of(collector.snapshot()), 90), (tmp_path / "agent.err").read_text()
        rss.append(ps.memory_info().rss)
        collector.stop()
        down_at = time.monotonic()
        while time.monotonic() - down_at < outage_s:
            assert proc.poll() is None, (tmp_path / "agent.err").read_text()
            rss.append(ps.memory_info().rss)
            time.sleep(1)
        n_before = len(spans_of(collector.snapshot()))
        back_at, back_epoch_ns = collector.start(), time.time_ns()
        assert wait_until(lambda: collector.first_after_start is not None, 120), "export never resumed"
        stall_s = collector.first_after_start - back_at
        # counters exported after the outage show the drops
        assert wait_until(lambda: sum(_drops(collector.snapshot()).values()) > 0, 60), _drops(collector.snapshot())
        time.sleep(3)  # a little tracing after the outage
        rss.append(ps.memory_info().rss)
        (tmp_path / "stop").touch()
        assert proc.wait(timeout=240) == 0, (tmp_path / "agent.err").read_text()
    finally:
        (tmp_path / "stop").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        collector.stop()
    requests = collector.snapshot()
    spans = [s for res, _, s in spans_of(requests) if s.name == "cudaMemcpy"]
    drops = _drops(requests)
    calls = loop_calls(tmp_path)
    late = [s for s in spans if s.start_time_unix_nano > back_epoch_ns]
    assert late, "spans made after the endpoint came back must arrive"
    # every call is an exported span or a counted drop (+ the few lifecycle records: exec, exit, library)
    assert calls <= len(spans) + sum(drops.values()) <= calls + 10, (calls, len(spans), drops)
    growth_mib = (max(rss) - rss[0]) / 2**20
    assert growth_mib < 200, f"RSS grew {growth_mib:.0f} MiB during the outage"
    print(f"\noutage {outage_s}s: calls={calls} spans exported={len(spans)} (before return {n_before}) "
          f"drops={drops} stall after return={stall_s:.1f}s RSS start={rss[0] / 2**20:.0f} MiB "
          f"max={max(rss) / 2**20:.0f} MiB")
    assert stall_s <= RECOVERY_S, f"first spans {stall_s:.1f}s after the collector returned (bound {RECOVERY_S}s)"
