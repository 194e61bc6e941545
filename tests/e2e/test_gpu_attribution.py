"""GPU attribution as a user runs the agent: hw.id on CUDA spans, pod names on per-process GPU use.

Both run the CLI with the stand-in libnvidia-ml.so.1 (tests/support/stand_in_nvml.c, NOT NVIDIA's
library) found by the real pynvml through LD_LIBRARY_PATH. Its default scenario has two GPUs,
``GPU-5a1d0000-0000-4000-8000-00000000000{0,1}``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_nvml import latest
from tests.support.build import build_stand_in_nvml
from tests.support.cgroup import PodCgroup
from tests.support.otlp_sink import decode_attrs, metrics_from_jsonl, spans_from_jsonl

ROOT = Path(__file__).resolve().parents[2]
GPU0 = "GPU-5a1d0000-0000-4000-8000-000000000000"
GPU1 = "GPU-5a1d0000-0000-4000-8000-000000000001"


@pytest.mark.bpf
def test_cuda_spans_carry_the_hw_id_cuda_visible_devices_selects(bpf_ready, built, cudart, tmp_path: Path) -> None:
    """The real libcudart in cuda_driver, run twice: with CUDA_VISIBLE_DEVICES=<the stand-in's
    second GPU> its calls are on that GPU; with both GPUs visible its cudaSetDevice(1) fails
    (no driver: rc 35), so the thread stays on CUDA's default device 0, the first visible GPU."""
    lib = build_stand_in_nvml()
    driver = f"{built['cuda_driver']} {cudart}"
    script = f"CUDA_VISIBLE_DEVICES={GPU1} {driver} && CUDA_VISIBLE_DEVICES=0,1 {driver}"
    env = {k: v for k, v in os.environ.items() if k not in ("STAND_IN_NVML_SCENARIO", "CUDA_VISIBLE_DEVICES")}
    env["LD_LIBRARY_PATH"] = str(lib.parent)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--output", str(out), "--", "sh", "-c", script],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    by_pid: dict[int, list[Any]] = defaultdict(list)
    for res, scope, span in spans_from_jsonl(out / "traces.jsonl"):
        if scope == "otel_ebpf.cuda":
            by_pid[res["process.pid"]].append(span)
    assert len(by_pid) == 2, r.stderr
    first_pid, second_pid = sorted(by_pid, key=lambda pid: min(s.start_time_unix_nano for s in by_pid[pid]))
    assert {"cudaSetDevice", "cudaMalloc", "cudaMemcpy", "cudaFree"} <= {s.name for s in by_pid[first_pid]}
    assert {decode_attrs(s.attributes).get("hw.id") for s in by_pid[first_pid]} == {GPU1}
    assert {decode_attrs(s.attributes).get("hw.id") for s in by_pid[second_pid]} == {GPU0}
    errors = {res["process.pid"]: {decode_attrs(p.attributes).get("hw.id") for p in m.sum.data_points}
              for res, m in metrics_from_jsonl(out / "metrics.jsonl") if m.name == "gpu.cuda.api.errors"}
    assert errors[first_pid] == {GPU1} and errors[second_pid] == {GPU0}


@pytest.mark.bpf
def test_nccl_spans_and_metrics_carry_the_hw_id_of_the_only_visible_gpu(bpf_ready, built, tmp_path: Path) -> None:
    """A one-rank job on the stand-in libnccl.so.2 with CUDA_VISIBLE_DEVICES=<the stand-in NVML's
    first GPU>: the communicator's device is never asked (no ncclCommCuDevice), but one GPU is
    visible, so every NCCL span and nccl.calls carry its UUID."""
    lib = build_stand_in_nvml()
    env = {k: v for k, v in os.environ.items() if k not in ("STAND_IN_NVML_SCENARIO", "CUDA_VISIBLE_DEVICES")}
    env.update(LD_LIBRARY_PATH=str(lib.parent), CUDA_VISIBLE_DEVICES=GPU0)
    out = tmp_path / "out"
    rank = [str(built["nccl_rank"]), str(built["stand_in_nccl"]), "--rank", "0", "--nranks", "1",
            "--id-file", str(tmp_path / "id"), "--create-id"]
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--output", str(out), "--", *rank],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    spans = [s for _, scope, s in spans_from_jsonl(out / "traces.jsonl") if scope == "otel_ebpf.nccl"]
    assert {"ncclCommInitRank", "ncclAllReduce", "ncclSend", "ncclRecv"} <= {s.name for s in spans}, r.stderr
    per_rank = [s for s in spans if not s.name.startswith("nccl ") and s.name != "ncclGroup"]  # not roots, groups
    assert {s.name: decode_attrs(s.attributes).get("hw.id") for s in per_rank} == {s.name: GPU0 for s in per_rank}
    calls = [decode_attrs(p.attributes) for _, m in metrics_from_jsonl(out / "metrics.jsonl") if m.name == "nccl.calls"
             for p in m.sum.data_points]
    assert calls and {c.get("hw.id") for c in calls} == {GPU0}


def _config(tmp_path: Path, out: Path) -> Path:
    cfg = {"receivers": {"nvml": {"interval": 0.3, "event_wait": 0.1, "xid_events": False}},
           "exporters": {"file": {"directory": str(out)}},
           "service": {"metrics_interval": 0.5, "k8s": {"kubelet_url": "off"},
                       "pipelines": {"default": {"receivers": ["nvml"], "processors": [], "exporters": ["file"]}}}}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


def test_per_process_gpu_memory_sums_by_pod_on_a_shared_gpu(tmp_path: Path) -> None:
    """Three processes share GPU 0: two in pod trainer-0, one in pod notebook (each in a real
    cgroup named for its pod, names from its downward-API environment). Each process's
    hw.gpu.memory.usage is on its own resource with its pod's names, so summing by k8s.pod.name
    gives each pod's share of the GPU."""
    lib = build_stand_in_nvml()
    pods = [("trainer-0", "ml-team", 3 << 30), ("trainer-0", "ml-team", 1 << 30), ("notebook", "notebooks", 2 << 30)]
    uids = {"trainer-0": "7d1e3c5a-2b4f-4e6a-8c0d-1f3a5b7c9e2d", "notebook": "0a2c4e6f-8b1d-4f3a-9c5e-7d9f1b3a5c7e"}
    cgroups = {name: PodCgroup(uid) for name, uid in uids.items()}
    procs = [subprocess.Popen(["sleep", "60"], env={"PATH": os.environ.get("PATH", ""), "POD_NAME": name,
                                                    "POD_NAMESPACE": ns, "CONTAINER_NAME": "main"})
             for name, ns, _ in pods]
    for p, (name, _, _) in zip(procs, pods, strict=True):
        cgroups[name].add(p.pid)  # before the agent reads its /proc
    scenario = tmp_path / "scenario.txt"
    scenario.write_text("gpu 0\nmem_used 8589934592\n" + "".join(f"proc {p.pid} {used}\n" for p, (_, _, used)
                                                                   in zip(procs, pods, strict=True)))
    out = tmp_path / "out"
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent), "STAND_IN_NVML_SCENARIO": str(scenario)}
    pid_args = [a for p in procs for a in ("--pid", str(p.pid))]
    agent = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "run", "--config", str(_config(tmp_path, out)),
                              *pid_args], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        rows: list[Any] = []
        while time.monotonic() < deadline:
            rows = metrics_from_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
            if len([r for r in latest(rows, "hw.gpu.memory.usage") if "k8s.pod.name" in r[0]]) == 3:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for cgroup in cgroups.values():
            cgroup.remove()
        try:
            _, stderr = agent.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            _, stderr = agent.communicate()
    assert agent.returncode == 0, stderr
    per_process = [(res, attrs, value) for res, attrs, value in latest(rows, "hw.gpu.memory.usage")
                   if res.get("process.pid") in {p.pid for p in procs}]
    assert sorted((res["process.pid"], res["k8s.pod.uid"], res["k8s.pod.name"], res["k8s.namespace.name"],
                   res["k8s.container.name"], attrs["hw.id"], value) for res, attrs, value in per_process) == sorted(
        (p.pid, uids[name], name, ns, "main", GPU0, used) for p, (name, ns, used) in zip(procs, pods, strict=True))
    by_pod: dict[tuple[str, str], float] = defaultdict(float)  # sum by (k8s_pod_name, hw_id), as in docs/nvml.md
    for res, attrs, value in per_process:
        by_pod[(res["k8s.pod.name"], attrs["hw.id"])] += value
    assert by_pod == {("trainer-0", GPU0): 4 << 30, ("notebook", GPU0): 2 << 30}
