"""Readiness follows the BPF receivers: /readyz answers 503 naming the cuda receiver while its
program compiles and attaches, then 200 once the poll thread runs (real probes, real HTTP)."""
from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf import settings
from otel_ebpf.agent import Agent


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
