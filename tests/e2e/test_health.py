"""The health endpoint (otel_ebpf.service.health) over real HTTP: an agent run as a user runs it, with the
nvml receiver on the stand-in libnvidia-ml.so.1 (tests/support/stand_in_nvml.c, not NVIDIA's
library), so no BPF is needed; an agent object that is built but not started; a stuck pipeline
queue; the gateway; and a taken address, which must be named."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_ebpf.service import health
from otel_ebpf.service.agent import Agent
from otel_ebpf.core.pipeline import BoundedQueue
from otel_ebpf.core.telemetry import Telemetry
from tests.support.build import build_stand_in_nvml

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def write_config(tmp_path: Path, endpoint: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({
        "receivers": {"nvml": {"interval": 0.3, "event_wait": 0.1}},
        "exporters": {"file": {"directory": str(tmp_path / "out")}},
        "service": {"metrics_interval": 0.5, "health_endpoint": endpoint, "pipelines": {"default": {
            "receivers": ["nvml"], "processors": ["cuda", "nccl"], "exporters": ["file"]}}}}))
    path.chmod(0o600)
    return path


@pytest.fixture
def running_agent(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[str]]]:
    lib = build_stand_in_nvml()
    workload = subprocess.Popen(["sleep", "60"])
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(f"count 1\ngpu 0\nproc {workload.pid} 1048576\n")
    port = free_port()
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "STAND_IN_NVML_SCENARIO": str(scenario)}
    proc = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "run", "--config",
                             str(write_config(tmp_path, f"127.0.0.1:{port}")), "--pid", str(workload.pid)],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        yield port, proc
    finally:
        workload.kill()
        workload.wait()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_running_agent_is_alive_and_ready(running_agent: tuple[int, subprocess.Popen[str]]) -> None:
    port, proc = running_agent
    deadline = time.monotonic() + 30
    status: tuple[int, dict[str, Any]] | None = None
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            status = get(f"http://127.0.0.1:{port}/readyz")
            if status[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    assert status is not None and status[0] == 200, status
    body = status[1]
    assert body["status"] == "ready" and body["failing"] == []
    states = {c["component"]: c for c in body["components"]}
    assert set(states) == {"receiver/nvml", "pipeline/default"}
    assert states["receiver/nvml"]["detail"] == "running"
    code, live = get(f"http://127.0.0.1:{port}/healthz")
    assert code == 200 and live["status"] == "alive"
    assert get(f"http://127.0.0.1:{port}/metrics")[0] == 404  # the prometheus exporter serves metrics


def test_built_but_not_started_agent_is_alive_but_not_ready(tmp_path: Path) -> None:
    from otel_ebpf.service import settings
    agent = Agent(settings.load(str(write_config(tmp_path, "127.0.0.1:0"))))
    server = health.HealthServer("127.0.0.1", 0, health.agent_checks(agent))
    try:
        code, body = get(f"http://127.0.0.1:{server.port}/readyz")
        assert code == 503 and body["status"] == "not ready"
        assert body["failing"] == ["receiver/nvml", "pipeline/default"]
        details = {c["component"]: c["detail"] for c in body["components"]}
        assert details == {"receiver/nvml": "not started", "pipeline/default": "worker not started"}
        assert get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200
    finally:
        server.shutdown()
        server.shutdown()  # safe twice


class _Blocking:
    """A pipeline stage that holds its batch until released (a hung exporter)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def consume(self, events: Any) -> None:
        self.release.wait(10)


def test_a_stuck_queue_makes_the_pipeline_not_ready() -> None:
    stage = _Blocking()
    queue = BoundedQueue(stage, Telemetry(), max_events=100, name="default")
    watch = health._QueueWatch(stuck_after=0.3)
    queue.start()
    try:
        queue.consume([1])
        time.sleep(0.1)  # the worker holds [1]
        queue.consume([2, 3])  # waits behind it
        assert watch.check("pipeline/default", queue).ready  # first look: not stuck yet
        time.sleep(0.5)
        check = watch.check("pipeline/default", queue)
        assert not check.ready and check.alive and check.detail.startswith("stuck: 2 events waiting")
        stage.release.set()
        queue.flush()
        time.sleep(0.1)
        assert watch.check("pipeline/default", queue).ready
    finally:
        stage.release.set()
        queue.shutdown()


def test_gateway_serves_health_and_stops_serving(tmp_path: Path) -> None:
    from otel_ebpf.gateway import Gateway, config

    port = free_port()
    cfg_file = tmp_path / "gw.yaml"
    cfg_file.write_text(yaml.safe_dump({"service": {"health_endpoint": f"127.0.0.1:{port}"}}))
    cfg_file.chmod(0o600)
    gw = Gateway(config.load(str(cfg_file), output=str(tmp_path / "gw"), grpc_endpoint="127.0.0.1:0",
                             http_endpoint="127.0.0.1:0"))
    gw.start()
    try:
        code, body = get(f"http://127.0.0.1:{port}/readyz")
        assert code == 200, body
        assert {c["component"] for c in body["components"]} == {"receiver/otlp", "queue/traces", "queue/metrics"}
    finally:
        gw.shutdown()
        gw.shutdown()
    with pytest.raises(OSError):
        get(f"http://127.0.0.1:{port}/healthz")


def test_a_taken_address_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--config", str(write_config(tmp_path, address)),
                            "--", "true"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"cannot serve the health endpoint on {address} (service.health_endpoint)" in r.stderr


def test_a_bad_endpoint_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "config", "--validate",
                        str(write_config(tmp_path, "localhost"))], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert "config error at 'service.health_endpoint': 'localhost' is not HOST:PORT" in r.stderr

