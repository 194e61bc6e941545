"""The agent as a user runs it, with the nvml receiver on the stand-in libnvidia-ml.so.1.

The stand-in (tests/support/stand_in_nvml.c, not NVIDIA's library) is found by the REAL pynvml
through LD_LIBRARY_PATH, as NVIDIA's would be. Its scenario puts a process this test starts on
GPU 0, delivers XID 79, makes nvmlDeviceGetFanSpeed unsupported and GPU 1 lost. The records go
through the cuda and nccl processors (which pass them on) to the file exporter.
"""
from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_ebpf.receivers.nvml.presence import nvidia_gpus
from tests.support.build import build_stand_in_nvml
from tests.support.otlp_sink import decode_attrs, metrics_from_jsonl

ROOT = Path(__file__).resolve().parents[2]
GPU0 = "GPU-0e2e0000-1111-4222-8333-444455556666"


def points(metric: Any) -> list[tuple[dict[str, Any], float]]:
    data = getattr(metric, metric.WhichOneof("data"))
    return [(decode_attrs(dp.attributes), getattr(dp, dp.WhichOneof("value")) if hasattr(dp, "as_int") else dp.sum)
            for dp in data.data_points]


def latest(rows: list[tuple[dict[str, Any], Any]], name: str, **attrs: Any) -> list[tuple[dict, dict, float]]:
    """(resource attrs, point attrs, value) of ``name`` in the last export that has it."""
    found: list[tuple[dict, dict, float]] = []
    for res, metric in rows:
        if metric.name != name:
            continue
        batch = [(res, a, v) for a, v in points(metric) if all(a.get(k) == x for k, x in attrs.items())]
        if batch:
            found = [f for f in found if f[0] != res] + batch
    return found


def config(tmp_path: Path, out: Path, receivers: dict[str, Any] | None = None) -> Path:
    cfg = {"receivers": {"nvml": receivers or {"interval": 0.3, "event_wait": 0.1}},
           "exporters": {"file": {"directory": str(out)}},
           "service": {"metrics_interval": 0.5,
                       "pipelines": {"default": {"receivers": ["nvml"], "processors": ["cuda", "nccl"],
                                                 "exporters": ["file"]}}}}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


def test_gpu_and_per_process_metrics_xid_and_partial_scrape(tmp_path: Path) -> None:
    lib = build_stand_in_nvml()
    workload = subprocess.Popen(["sleep", "60"])
    out = tmp_path / "out"
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(f"fail nvmlDeviceGetFanSpeed NOT_SUPPORTED\ngpu 0\nuuid {GPU0}\nname NVIDIA H100 80GB HBM3\n"
                        f"mem_used 4294967296\nproc {workload.pid} 1073741824\nputil {workload.pid} 70 20 0 0\n"
                        "xid 79\ngpu 1\nlost 1\n")
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "STAND_IN_NVML_SCENARIO": str(scenario),
           "PYTHONUNBUFFERED": "1"}
    agent = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "run", "--config", str(config(tmp_path, out)),
                              "--pid", str(workload.pid)], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = metrics_from_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
            if latest(rows, "hw.errors", **{"error.type": "xid_79"}) and latest(rows, "otel_ebpf.nvml.scrape.errors"):
                break
            time.sleep(0.2)
    finally:
        workload.kill()
        workload.wait()
        try:
            _, stderr = agent.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            _, stderr = agent.communicate()
    assert agent.returncode == 0, stderr
    rows = metrics_from_jsonl(out / "metrics.jsonl")

    # GPU series: on the agent's resource, hw.id exactly as nvmlDeviceGetUUID / dcgm-exporter write it.
    def on_agent(name: str, **attrs: Any) -> list[tuple[dict, dict, float]]:
        return [row for row in latest(rows, name, **attrs) if row[0].get("service.name") == "otel-ebpf"]

    [(res, attrs, value)] = on_agent("hw.gpu.utilization", **{"hw.id": GPU0, "hw.gpu.task": "general"})
    assert value == 0.40 and res.get("process.pid") != workload.pid
    assert attrs["hw.model"] == "NVIDIA H100 80GB HBM3" and attrs["hw.vendor"] == "NVIDIA"
    [(_, _, used)] = on_agent("hw.gpu.memory.usage", **{"hw.id": GPU0})
    assert used == 4294967296

    # Per-process memory on the workload's own resource (where its eBPF spans would be).
    per_process = [(r, a, v) for r, a, v in latest(rows, "hw.gpu.memory.usage") if r.get("process.pid") == workload.pid]
    assert [(a["hw.id"], v) for _, a, v in per_process] == [(GPU0, 1073741824)]
    util = latest(rows, "hw.gpu.utilization", **{"hw.gpu.task": "general"})
    assert [v for r, _, v in util if r.get("process.pid") == workload.pid] == [0.70]

    # XID 79: counted once, one warning line.
    [(_, _, xids)] = latest(rows, "hw.errors", **{"error.type": "xid_79"})
    assert xids == 1
    assert stderr.count("XID 79") == 1 and "GPU has fallen off the bus" in stderr

    # Partial scrape: fan unsupported (counted once), GPU 1 lost (counted per scrape), GPU 0 complete.
    errors = {(a["function"], a["error"]): v for _, a, v in latest(rows, "otel_ebpf.nvml.scrape.errors")}
    assert errors[("nvmlDeviceGetFanSpeed", "NotSupported")] == 1
    assert sum(v for (_, e), v in errors.items() if e == "GpuIsLost") >= 2
    assert not latest(rows, "hw.fan.speed_ratio")
    assert [v for _, _, v in on_agent("hw.status", **{"hw.state": "failed"}) if v == 1]
    assert on_agent("hw.temperature", **{"hw.id": GPU0})


def _real_nvml_present() -> bool:
    return ctypes.util.find_library("nvidia-ml") is not None


def _no_gpu_here() -> None:
    if _real_nvml_present():
        pytest.skip("this host has a real libnvidia-ml.so.1")
    if nvidia_gpus():
        pytest.skip("this host has an NVIDIA GPU on its PCI bus (its missing NVML is a warning: unit-tested)")


def test_without_a_gpu_the_agent_says_so_once_at_info_and_exits_0(tmp_path: Path) -> None:
    """A GPU-less host: no warning at the default log level; one INFO line with --log-level info."""
    _no_gpu_here()
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "STAND_IN_NVML_SCENARIO",
                                                             "OTEL_EBPF_LOG_LEVEL")}
    for level, expect in (("warning", []), ("info", [
            "otel-ebpf INFO otel_ebpf.receivers.nvml.receiver: no NVIDIA driver/GPU: NVML metrics off: "
            "libnvidia-ml.so.1 was not found (no NVIDIA driver on this host)"])):
        r = subprocess.run([sys.executable, "-m", "otel_ebpf", "--log-level", level, "run", "--config",
                            str(config(tmp_path, tmp_path / "o")), "--", "sleep", "0.5"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        said = [ln for ln in r.stderr.splitlines()
                if "WARNING" in ln or "ERROR" in ln or "otel_ebpf.receivers.nvml" in ln or "NVIDIA" in ln]
        assert said == expect, (level, r.stderr)


@pytest.mark.bpf
def test_default_pipeline_without_nvml_runs_the_command(bpf_ready, tmp_path: Path) -> None:
    """Every GPU-less host runs this path: nvml is in the default pipeline next to the probes; nothing about
    NVML reaches the terminal at the default log level."""
    _no_gpu_here()
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "STAND_IN_NVML_SCENARIO",
                                                             "OTEL_EBPF_LOG_LEVEL")}
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--output", str(tmp_path), "--", "sh", "-c",
                        "exit 3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "nvml" not in r.stderr.lower() and "NVIDIA" not in r.stderr, r.stderr
