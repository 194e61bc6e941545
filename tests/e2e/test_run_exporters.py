"""Where ``run`` sends its data, as a user runs it: flags next to a config's exporters."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.otlp_sink import metrics_from_jsonl

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.bpf


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_ebpf", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_output_flag_adds_the_file_exporter_and_the_configs_prometheus_still_listens(bpf_ready, tmp_path):
    port = _free_port()
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "exporters": {"prometheus": {"endpoint": f"127.0.0.1:{port}"}},
        "service": {"metrics_interval": "1s",
                    "pipelines": {"default": {"receivers": ["memory"], "processors": ["memory"],
                                              "exporters": ["prometheus"]}}}}))
    config.chmod(0o600)
    scrape = tmp_path / "scrape.txt"
    # the command scrapes the agent's /metrics once the agent's own counters are there
    job = ("import time, urllib.request, sys\n"
           "for _ in range(100):\n"
           "    time.sleep(0.1)\n"
           "    try: body = urllib.request.urlopen(sys.argv[1], timeout=2).read().decode()\n"
           "    except OSError: continue\n"
           "    if 'otel_ebpf_events_received' in body: break\n"
           "open(sys.argv[2], 'w').write(body)\n")
    out = tmp_path / "out"
    r = _cli("run", "--config", str(config), "--output", str(out), "--",
             sys.executable, "-c", job, f"http://127.0.0.1:{port}/metrics", str(scrape))
    assert r.returncode == 0, r.stderr
    assert "otel_ebpf_events_received" in scrape.read_text()  # the config's prometheus exporter listened
    names = {m.name for _, m in metrics_from_jsonl(out / "metrics.jsonl")}  # and --output's file exporter wrote
    assert "otel_ebpf.events.received" in names
    assert "prometheus -> " in r.stderr and f"file -> {out}" in r.stderr  # the summary names both
