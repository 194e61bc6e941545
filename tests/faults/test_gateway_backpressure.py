"""The gateway's downstream stalls for 30 s under a flood from 4 agents.

Set-up: a collector (an OtlpServer in this process) behind an ``otel-ebpf gateway`` subprocess,
4 agent processes (:mod:`tests.faults.flood_agent`: the project's Emitter) sending 500 spans/s
each over OTLP/gRPC to the gateway. After 5 s the collector refuses everything (UNAVAILABLE) for
``STALL_S``: the gateway's exporter queue fills, its ExportGate holds the pipeline, its trace
queue fills and it refuses the agents' requests; the agents retry, then fill their own bounded
queues and count what they drop. Then the collector accepts again.

Asserted: the gateway refused requests (agents' retries: ``otel_ebpf.events.refused`` > 0);
spans made during the stall arrive after it; no span arrives twice; and every span sent is
either at the collector or counted lost in the gateway's ``otel_ebpf.events.lost`` (its own drops
plus the agents' drops it read from their metrics), which matches the agents' own counters.
Printed (``-s``): the figures. ``--soak``: a 300 s stall. No root, no BCC; loopback only.
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from otel_ebpf.receivers.otlp.server import OtlpServer
from tests.support.otlp_sink import decode_attrs, metrics_of, spans_of

ROOT = Path(__file__).resolve().parents[2]
AGENTS = 4
RATE = 500  # spans/s per agent: 2,000/s in all, what 2 shared cores carry with the gateway and collector
BEFORE_S = 5.0
AFTER_S = 10.0
pytestmark = pytest.mark.timeout(900)


class Collector:
    """Keeps every request with its arrival time; refuses everything while ``stalled``."""

    def __init__(self) -> None:
        self.stalled = threading.Event()
        self._lock = threading.Lock()
        self.kept: list[tuple[float, object]] = []
        self.refused = 0
        self.server = OtlpServer(grpc_endpoint="127.0.0.1:0", http_endpoint=None, on_traces=self._on,
                                 on_metrics=self._on, retry_after=1.0)

    def _on(self, request: object) -> bool:
        with self._lock:
            if self.stalled.is_set():
                self.refused += 1
                return False
            self.kept.append((time.monotonic(), request))
            return True

    def snapshot(self) -> list[tuple[float, object]]:
        with self._lock:
            return list(self.kept)


def _start_gateway(tmp_path: Path, collector_port: int) -> tuple[subprocess.Popen, int]:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text("receivers:\n  otlp: {wait_for_room: 0s, retry_after: 1s}\n"
                   "exporters:\n  otlp:\n    timeout: 5s\n"
                   "    batch: {queue_size: 2048, batch_size: 512, batch_delay: 100ms}\n"
                   "    retry_on_failure: {initial_interval: 500ms, max_interval: 2s, max_elapsed_time: 0s}\n"
                   "service:\n  max_queue: 4096\n  metrics_interval: 1s\n  health_endpoint: ''\n")
    cfg.chmod(0o600)
    err = open(tmp_path / "gateway.stderr", "w")  # the child keeps its own descriptor
    proc = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "gateway", "--config", str(cfg),
                             "--grpc-endpoint", "127.0.0.1:0", "--http-endpoint", "",
                             "--otlp-endpoint", f"http://127.0.0.1:{collector_port}", "--otlp-protocol", "grpc"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    err.close()
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()
    try:
        m = re.search(r"grpc=(\d+)", lines.get(timeout=60))
    except queue.Empty:
        proc.kill()
        pytest.fail(f"gateway did not start in 60s: {(tmp_path / 'gateway.stderr').read_text()}")
    assert m, (tmp_path / "gateway.stderr").read_text()
    return proc, int(m.group(1))


def _stop(proc: subprocess.Popen, timeout: float) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        return -9


def _last_sum(requests: list[object], name: str, **match: str) -> dict[tuple[tuple[str, object], ...], int]:
    """The last cumulative value of each series of ``name`` in the gateway's own metrics."""
    out: dict[tuple[tuple[str, object], ...], int] = {}
    for resource, metric in metrics_of(requests):
        if metric.name != name or resource.get("service.name") != "otel-ebpf-gateway":
            continue
        for dp in metric.sum.data_points:
            attrs = decode_attrs(dp.attributes)
            if all(attrs.get(k) == v for k, v in match.items()):
                out[tuple(sorted(attrs.items()))] = dp.as_int
    return out


@pytest.mark.idle_window
def test_gateway_stall_refuses_agents_retry_and_every_span_is_delivered_or_counted(tmp_path, soak):
    stall_s = 300.0 if soak else 30.0
    flood_s = BEFORE_S + stall_s + AFTER_S
    collector = Collector()
    collector.server.start()
    gateway, port = _start_gateway(tmp_path, collector.server.grpc_port)
    agents: list[subprocess.Popen] = []
    try:
        for i in range(AGENTS):
            agents.append(subprocess.Popen(
                [sys.executable, "-m", "tests.faults.flood_agent", "--endpoint", f"http://127.0.0.1:{port}",
                 "--agent", str(i), "--rate", str(RATE), "--duration", str(flood_s),
                 "--out", str(tmp_path / f"agent{i}.json")],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"agent{i}.stderr", "w")))
        time.sleep(BEFORE_S)
        collector.stalled.set()
        stall_at = time.monotonic()
        stall_epoch_ns = time.time_ns()
        time.sleep(stall_s)
        collector.stalled.clear()
        lifted_at = time.monotonic()
        lifted_epoch_ns = time.time_ns()
        for i, agent in enumerate(agents):  # flood_s, then at most the Emitter's 20 s shutdown
            assert agent.wait(timeout=AFTER_S + 60) == 0, (tmp_path / f"agent{i}.stderr").read_text()
        rc = _stop(gateway, 60)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
        if gateway.poll() is None:
            gateway.kill()
        collector.server.shutdown()
    stderr = (tmp_path / "gateway.stderr").read_text()
    assert rc == 0 and "Traceback" not in stderr, stderr[-4000:]

    results = [json.loads((tmp_path / f"agent{i}.json").read_text()) for i in range(AGENTS)]
    sent = sum(r["sent"] for r in results)
    agent_dropped = Counter()
    for r in results:
        agent_dropped.update(r["dropped"])
    kept = collector.snapshot()
    requests = [r for _, r in kept]
    ids = Counter(span.span_id for _, _, span in spans_of(requests) if span.name == "flood")
    arrived, duplicates = len(ids), sum(n - 1 for n in ids.values())
    late = sum(1 for t, r in kept if t > lifted_at
               for _, _, s in spans_of([r]) if s.name == "flood" and stall_epoch_ns <= s.start_time_unix_nano
               < lifted_epoch_ns)
    lost = _last_sum(requests, "otel_ebpf.events.lost")
    lost_agent = sum(v for k, v in lost.items() if dict(k)["layer"] == "agent")
    lost_gateway = sum(v for k, v in lost.items() if dict(k)["layer"] == "gateway")
    refused = sum(_last_sum(requests, "otel_ebpf.events.refused", signal="traces").values())
    print(f"\ngateway stall {stall_s:.0f}s, {AGENTS} agents x {RATE} spans/s: sent={sent} arrived={arrived} "
          f"duplicates={duplicates} arrived after the stall (made during it)={late} "
          f"refused by the gateway (spans, retries included)={refused} collector refusals={collector.refused} "
          f"lost: agents={lost_agent} {dict(agent_dropped)} gateway={lost_gateway} "
          f"{ {dict(k)['reason']: v for k, v in lost.items() if dict(k)['layer'] == 'gateway'} } "
          f"stall measured {lifted_at - stall_at:.1f}s")
    assert duplicates == 0
    assert refused > 0, "the gateway never refused: its queue did not fill, or refusals are not counted"
    assert late > 0, "nothing made during the stall arrived after it"
    # the gateway's loss count reads every agent's final drop counters
    assert lost_agent == sum(agent_dropped.values()), (lost, agent_dropped)
    assert arrived + lost_agent + lost_gateway == sent, (arrived, lost, sent)
