"""Real-workload overhead: a CPU PyTorch training loop (bench/torch_loop.py), one command:
``sudo .venv/bin/python bench/torch_overhead.py [--rounds 5] [--steps 300]``.

Modes, interleaved round by round so drift hits all alike, medians reported:

* untraced;
* ``otel-ebpf run`` with the default pipeline (what a user gets without configuration; a CPU
  job loads no libcudart/libnccl, so the CUDA and NCCL probes never fire here, the host
  receivers do);
* ``otel-ebpf run`` with the default pipeline plus the ``torch`` receiver (operator uprobes on
  libtorch_cpu: every probed op traps);
* ``torch.profiler`` (CPU activity), the tool users reach for today.

The loop times itself (the training loop only: not ``import torch``, not the agent's start),
pinned to one CPU; the agent's threads run on the others. Prints a Markdown table: ms per step
and overhead versus untraced (issue 7 target: ours <= 3 % and below the profiler's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "bench" / "torch_loop.py"
PY = sys.executable


def _pin() -> list[str]:
    n = os.cpu_count() or 1
    return ["taskset", "-c", str(n - 1)] if n > 1 else []


def _config(path: Path, with_torch: bool) -> Path:
    import yaml

    from otel_ebpf.service import settings
    pipe = settings.default_data()["service"]["pipelines"]["default"]
    if with_torch:
        pipe = {**pipe, "receivers": [*pipe["receivers"], "torch"], "processors": [*pipe["processors"], "torch"]}
    path.write_text(yaml.safe_dump({"service": {"pipelines": {"default": pipe}}}))
    path.chmod(0o600)
    return path


def run_once(mode: str, steps: int, tmp: Path) -> float:
    loop = [*_pin(), PY, str(LOOP), "--steps", str(steps)]
    if mode == "untraced":
        argv = loop
    elif mode == "profiler":
        argv = [*loop, "--profiler"]
    else:
        cfg = _config(tmp / f"{mode}.yaml", with_torch=(mode == "torch"))
        argv = [PY, "-m", "otel_ebpf", "run", "--quiet", "--config", str(cfg), "--output", str(tmp / mode), "--",
                *loop]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{mode}: exit {out.returncode}: {out.stderr[-2000:]}")
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("{"))
    return float(json.loads(line)["ms_per_step"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (BPF)")
    modes = ("untraced", "default", "torch", "profiler")
    runs: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.rounds):
            for m in modes:
                runs[m].append(run_once(m, a.steps, Path(d)))
    med = {m: statistics.median(v) for m, v in runs.items()}
    base = med["untraced"]
    labels = {"untraced": "untraced", "default": "otel-ebpf run, default pipeline",
              "torch": "otel-ebpf run, default pipeline + torch receiver", "profiler": "torch.profiler (CPU)"}
    print(f"| CPU training loop ({a.steps} steps, median of {a.rounds}) | ms per step | overhead | runs (ms/step) |")
    print("|---|---:|---:|---|")
    for m in modes:
        over = "-" if m == "untraced" else f"{(med[m] / base - 1) * 100:+.1f} %"
        print(f"| {labels[m]} | {med[m]:.3f} | {over} | {', '.join(f'{x:.3f}' for x in runs[m])} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
