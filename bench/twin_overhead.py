"""Agent overhead on real PyTorch distributed: the demo's FSDP2 training step on the twin, traced vs untraced.
One command: ``sudo .venv/bin/python bench/twin_overhead.py [--rounds 5] [--steps 30] [--ranks 4] [--plugin]``.

The job is ``otel_ebpf/demo/train.py`` (FSDP2 over a 2-D DeviceMesh, real torch 2.11 on the twin's stand-in
libcudart/libnccl, one host) under ``torchrun --standalone``. Modes, interleaved round by round so drift hits
both alike:

* untraced;
* traced: ``otel-ebpf run`` with the pipeline the demo's agents run (cuda, nccl and sched receivers and
  processors), the stand-ins probed, spans and metrics to OTLP JSON lines files. ``run`` loads otel-ebpf's NCCL
  profiler plugin into the job (receivers.nccl.gpu_time), so this includes the GPU-time path.

With ``--plugin`` (issue 16, the NCCL profiler plugin) two more modes:

* plugin, no agent: untraced, but the job loads the plugin (``NCCL_PROFILER_PLUGIN``): its cost with nobody
  listening (NCCL's group API call and one branch per group);
* traced, no GPU time: traced with ``receivers.nccl.gpu_time: false`` (no plugin), so traced minus this is what
  the plugin's events and the agent's GPU spans cost.

A step's time is the interval between rank 0's consecutive ``oe-demo step`` lines, stamped as they arrive
(the program's output is unbuffered); the first ``--warmup`` steps are left out (communicator set-up, first
allocation). Per mode: the median over rounds of each round's median step. What this measures is host time:
the twin's kernels do nothing and its NCCL moves data through shared memory, so the step is almost all host
work (Python, torch's dispatcher, the NCCL calls) — the worst case for a probe's relative cost, since on a
GPU the host usually waits for the device. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "otel_ebpf" / "demo" / "train.py"
STEP = re.compile(r"oe-demo step rank=0 step=(\d+)")
PIPELINE = ["cuda", "nccl", "lifecycle", "sched"]  # what the demo's agents run


def _agent_config(path: Path, libdir: Path, pipeline: list[str], gpu_time: bool = True) -> Path:
    path.write_text(yaml.safe_dump({
        "receivers": {"cuda": {"libraries": [str(libdir / "libcudart.so.13")]},
                      "nccl": {"libraries": [str(libdir / "libnccl.so.2")], "gpu_time": gpu_time}},
        "service": {"pipelines": {"default": {"receivers": pipeline, "processors": pipeline}}}}))
    path.chmod(0o600)  # the agent refuses a world-writable config
    return path


MODES = ("untraced", "traced")
PLUGIN_MODES = ("untraced", "plugin, no agent", "traced, no GPU time", "traced")


def run_once(mode: str, ranks: int, steps: int, warmup: int, tmp: Path, timeout: float,
             pipeline: list[str] = PIPELINE) -> float:
    """One job in ``mode`` (module doc); the median step time in seconds (rank 0's step lines after ``warmup``)."""
    from otel_ebpf.nccl_profiler import NCCL_ENV, require_plugin

    from otel_ebpf.twin.build import build
    from otel_ebpf.twin.env import find_env
    from otel_ebpf.twin.launch import twin_environment

    twin = find_env()
    libdir = build(twin)
    staging = Path(tempfile.mkdtemp(prefix="otel-ebpf-twin-bench-", dir="/dev/shm"))
    job = [str(twin.python), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
           str(TRAIN), "--steps", str(steps)]
    argv = job
    env = twin_environment(libdir, ranks, staging)
    if mode == "plugin, no agent":
        env[NCCL_ENV] = str(require_plugin())
    if mode.startswith("traced"):
        cfg = _agent_config(tmp / "agent.yaml", libdir, pipeline, gpu_time=mode == "traced")
        out = tmp / f"traced-{time.monotonic_ns()}"
        argv = [sys.executable, "-m", "otel_ebpf", "run", "--quiet", "--config", str(cfg), "--output", str(out),
                "--", *job]
    stamps: dict[int, float] = {}
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        tail: deque[str] = deque(maxlen=20)
        for line in proc.stdout:
            m = STEP.search(line)
            if m:
                stamps[int(m.group(1))] = time.monotonic()
            tail.append(line)
            if time.monotonic() > deadline:
                os.killpg(proc.pid, 9)
                raise RuntimeError(f"the job ran past {timeout:.0f}s")
        if proc.wait(timeout=max(1.0, deadline - time.monotonic())) != 0:
            raise RuntimeError(f"the job exited {proc.returncode}:\n{''.join(tail)}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    ks = sorted(k for k in stamps if k > warmup)
    gaps = [stamps[k] - stamps[k - 1] for k in ks if k - 1 in stamps]
    if len(gaps) < 3:
        raise RuntimeError(f"only {len(gaps)} timed steps (rank 0 printed {len(stamps)} step lines)")
    return statistics.median(gaps)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--pipeline", default=",".join(PIPELINE), help="receivers (and processors) of the traced mode")
    p.add_argument("--plugin", action="store_true", help="also the NCCL profiler plugin's modes (module doc)")
    a = p.parse_args()
    if os.geteuid() != 0:
        print("run as root: the traced mode loads BPF programs", file=sys.stderr)
        return 2
    modes = PLUGIN_MODES if a.plugin else MODES
    results: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="otel-ebpf-bench-") as d:
        for r in range(a.rounds):
            for mode in modes if r % 2 == 0 else tuple(reversed(modes)):
                step = run_once(mode, a.ranks, a.steps, a.warmup, Path(d), a.timeout, a.pipeline.split(","))
                results[mode].append(step)
                print(f"round {r + 1}/{a.rounds} {mode}: {step * 1000:.1f} ms/step", file=sys.stderr, flush=True)
    base = statistics.median(results["untraced"])
    print(f"| mode ({a.pipeline}; {a.ranks} ranks, {a.steps} steps, {a.rounds} rounds) "
          "| ms per step (median) | vs untraced |")
    print("|---|---|---|")
    for mode, steps in results.items():
        med = statistics.median(steps)
        print(f"| {mode} | {med * 1000:.1f} (rounds: {', '.join(f'{s * 1000:.1f}' for s in steps)}) "
              f"| {med / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
