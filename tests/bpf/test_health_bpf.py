"""Readiness follows the BPF receivers: /readyz answers 503 naming the cuda receiver while its
program compiles and attaches, then 200 once the poll thread runs (real probes, real HTTP)."""
from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from otel_ebpf.service import settings
from otel_ebpf.service.agent import Agent


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.bpf
def test_readiness_flips_once_probes_are_attached(bpf_ready: None, tmp_path: Path) -> None:
    cfg = settings.load(output=str(tmp_path), extra={"service": {
        "health_endpoint": "127.0.0.1:0",
        "pipelines": {"default": {"receivers": ["cuda"], "processors": ["cuda"], "exporters": ["file"]}}}})
    workload = subprocess.Popen(["sleep", "60"])
    agent = Agent(cfg, target_pids=[workload.pid])
    errors: list[BaseException] = []

    def start() -> None:
        try:
            agent.start()
        except BaseException as exc:
            errors.append(exc)

    starter = threading.Thread(target=start)
    starter.start()
    seen: list[tuple[int, str]] = []
    try:
        deadline = time.monotonic() + 120
        while agent.health is None and starter.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        port = agent.health.port
        while time.monotonic() < deadline:
            code, body = readyz(port)
            cuda = next(c for c in body["components"] if c["component"] == "receiver/cuda")
            seen.append((code, cuda["detail"]))
            if code == 200:
                break
            time.sleep(0.05)
        starter.join(timeout=120)
        assert not errors, errors
        assert seen[0] == (503, "not started"), seen
        assert seen[-1] == (200, "running"), seen
    finally:
        starter.join(timeout=120)
        agent.shutdown()
        workload.kill()
        workload.wait()
    assert agent.health is None


@pytest.mark.bpf
def test_readiness_names_a_dead_pause_guard_supervisor(bpf_ready: None, tmp_path: Path) -> None:
    """Without its supervisor the agent stops no process (pause_on_load is off in effect): /readyz
    says so (503, component pause_guard) until the agent has restarted it."""
    cfg = settings.load(output=str(tmp_path), extra={"service": {
        "health_endpoint": "127.0.0.1:0",
        "pipelines": {"default": {"receivers": ["cuda"], "processors": ["cuda"], "exporters": ["file"]}}}})
    workload = subprocess.Popen(["sleep", "60"])
    agent = Agent(cfg, target_pids=[workload.pid])
    try:
        agent.start()
        code, body = readyz(agent.health.port)
        guard = next(c for c in body["components"] if c["component"] == "pause_guard")
        assert code == 200 and guard["ready"] and "running" in guard["detail"], body
        sups = [p for p in psutil.Process().children() if "otel_ebpf.bpf.pauseguard" in " ".join(p.cmdline())]
        assert len(sups) == 1, sups
        sups[0].send_signal(signal.SIGKILL)
        sups[0].wait(timeout=10)
        code, body = readyz(agent.health.port)
        guard = next(c for c in body["components"] if c["component"] == "pause_guard")
        assert code == 503 and "pause_guard" in body["failing"] and "not running" in guard["detail"], body
        deadline = time.monotonic() + 15  # the poll loop restarts it (at most every 10 s)
        while time.monotonic() < deadline and readyz(agent.health.port)[0] != 200:
            time.sleep(0.2)
        assert readyz(agent.health.port)[0] == 200
    finally:
        agent.shutdown()
        workload.kill()
        workload.wait()
