"""The agent's Prometheus endpoint scraped by Debian's REAL prometheus server (scripts/setup.sh
installs it), queried through its HTTP API. The nvml receiver runs on the stand-in
libnvidia-ml.so.1 (tests/support/stand_in_nvml.c, not NVIDIA's library); the same pipeline also
writes OTLP JSON lines, so the test checks Prometheus gets what OTLP gets.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.build import build_stand_in_nvml
from tests.support.otlp_sink import metrics_from_jsonl

ROOT = Path(__file__).resolve().parents[2]
GPU0 = "GPU-9f0e0000-aaaa-4bbb-8ccc-ddddeeeeffff"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


def wait_for(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@pytest.fixture
def prometheus_bin() -> str:
    path = shutil.which("prometheus")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Debian's prometheus must be installed in CI (scripts/setup.sh)")
        pytest.skip("needs Debian's prometheus (scripts/setup.sh installs it)")
    return path


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    """(exporter port, workload pid, OTLP out dir) of a running agent; stopped afterwards."""
    lib = build_stand_in_nvml()
    workload = subprocess.Popen(["sleep", "120"])
    port, out = free_port(), tmp_path / "out"
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(f"count 1\ngpu 0\nuuid {GPU0}\nutil_gpu 87\nproc {workload.pid} 536870912\n")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(yaml.safe_dump({
        "receivers": {"nvml": {"interval": 0.5}},
        "exporters": {"file": {"directory": str(out)}, "prometheus": {"endpoint": f"127.0.0.1:{port}"}},
        "service": {"metrics_interval": 0.5, "pipelines": {"default": {
            "receivers": ["nvml"], "processors": ["cuda", "nccl"], "exporters": ["file", "prometheus"]}}}}))
    cfg.chmod(0o600)
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "STAND_IN_NVML_SCENARIO": str(scenario)}
    proc = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "run", "--config", str(cfg), "--pid",
                             str(workload.pid)], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        yield port, workload.pid, out
    finally:
        workload.kill()
        workload.wait()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        assert proc.returncode == 0, err


@pytest.fixture
def prometheus(prometheus_bin: str, tmp_path: Path, agent: tuple[int, int, Path]) -> Iterator[int]:
    """A prometheus server scraping the agent every second; yields its web port."""
    web = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "otel-ebpf", "static_configs": [{"targets": [f"127.0.0.1:{agent[0]}"]}]}]}))
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen([prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for("prometheus to be ready", lambda: get(f"http://127.0.0.1:{web}/-/ready"), 60)
        yield web
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def query(web: int, promql: str) -> list[dict[str, Any]]:
    body = json.loads(get(f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_gpu_and_per_process_series(agent, prometheus) -> None:
    port, pid, out = agent
    util = wait_for("hw_gpu_utilization in prometheus",
                    lambda: query(prometheus, f'hw_gpu_utilization{{hw_id="{GPU0}",hw_gpu_task="general",'
                                              'service_name="otel-ebpf"}'), 60)
    [series] = util
    assert float(series["value"][1]) == 0.87
    assert series["metric"]["job"] == "otel-ebpf" and series["metric"]["hw_vendor"] == "NVIDIA"
    mem = wait_for("per-process memory", lambda: query(prometheus, f'hw_gpu_memory_usage_bytes{{process_pid="{pid}"}}'),
                   30)
    assert [(s["metric"]["hw_id"], float(s["value"][1])) for s in mem] == [(GPU0, 536870912.0)]
    # The agent's own telemetry comes along too.
    received = 'otel_ebpf_events_received_total{receiver="nvml"}'
    assert wait_for("agent telemetry", lambda: query(prometheus, received), 30)

    # Same metrics as the OTLP path: every OTLP metric name has a Prometheus family.
    page = get(f"http://127.0.0.1:{port}/metrics").decode()
    families = {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")}
    otlp = {m.name for _, m in metrics_from_jsonl(out / "metrics.jsonl")}
    missing = {n for n in otlp if not any(f.startswith(n.replace(".", "_")) for f in families)}
    assert "hw.gpu.utilization" in otlp and not missing, missing
