"""What the torch receiver's step grouping adds per operator call, one command:
``sudo .venv/bin/python bench/torch_step_cost.py [--rounds 5] [--steps 200] [--baseline REV]``.

Runs the CPU training loop of bench/torch_loop.py (3-layer MLP, SGD with momentum) under the torch
receiver alone (loaded here, as the BPF tests do), in three variants interleaved round by round:

* ``baseline``: torch.bpf.c and torch.h as of git revision ``REV`` (default: the commit before
  steps and Python nesting were added), ``steps: false``;
* ``steps off``: this tree's program, ``steps: false`` (one trace per top-level call; the
  enclosing Python call is still looked up at each top-level call);
* ``steps on``: this tree's program, default config (step markers probed).

Per variant, the median over rounds of: the loop's ms per step (wall: the uprobe traps dominate,
and the loaded machine's noise too), and the kernel's own run time per program invocation read
from the BPF programs' ``/proc/self/fdinfo`` (``run_time_ns`` / ``run_cnt``, with
``kernel.bpf_stats_enabled`` = 1 for the run, restored after): ns per operator call = mean
entry program run + mean return program run. The trap itself (uprobe + uretprobe) is the same
in every variant and is not in these figures. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
LOOP = ROOT / "bench" / "torch_loop.py"
STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
BASELINE = "632cb14^"  # the tree before one trace per step (issue 18)
WRAP = ("import runpy, sys; sys.stdin.readline(); sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')")
PROGRAMS = ("torch_op_enter", "torch_op_return", "torch_rf_enter", "torch_rf_entered", "torch_rf_exit")


def _baseline_src(rev: str, into: Path) -> Path:
    for name in ("torch.bpf.c", "torch.h"):
        text = subprocess.run(["git", "show", f"{rev}:otel_ebpf/receivers/torch/{name}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        (into / name).write_text(text)
    return into / "torch.bpf.c"


def _prog_stats(receiver: Any) -> dict[str, tuple[int, int]]:
    """BPF function name -> (run_time_ns, run_cnt) of its loaded program."""
    out = {}
    for name in PROGRAMS:
        fn = receiver._bpf.funcs.get(name.encode())
        if fn is None:
            continue
        fields = dict(line.split(":\t", 1) for line in Path(f"/proc/self/fdinfo/{fn.fd}").read_text().splitlines()
                      if ":\t" in line)
        out[name] = (int(fields.get("run_time_ns", 0)), int(fields.get("run_cnt", 0)))
    return out


def run_once(variant: str, steps: int, baseline_src: Path) -> dict[str, Any]:
    from otel_ebpf.core.config import build
    from otel_ebpf.core.events import ProcessExit
    from otel_ebpf.core.pipeline import Context, ListConsumer
    from otel_ebpf.receivers.torch import Config, TorchReceiver
    from otel_ebpf.receivers.torch.events import TorchOp

    cls: type[TorchReceiver] = TorchReceiver
    if variant == "baseline":
        cls = type("BaselineTorchReceiver", (TorchReceiver,), {"src_file": baseline_src})
    cfg = build(Config, {} if variant == "steps on" else {"steps": False})
    proc = subprocess.Popen([sys.executable, "-c", WRAP, str(LOOP), "--steps", str(steps)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    sink = ListConsumer()
    receiver = cls(cfg, Context(target_pids=[proc.pid]), sink)
    try:
        receiver.start()
        out, _ = proc.communicate("go\n", timeout=600)
        deadline = time.monotonic() + 20
        while not any(isinstance(e, ProcessExit) for e in sink.events) and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = _prog_stats(receiver)
    finally:
        receiver.shutdown()
        if proc.poll() is None:
            proc.kill()
    line = next(ln for ln in out.splitlines() if ln.startswith("{"))
    ops = sum(isinstance(e, TorchOp) for e in sink.events)
    (t_in, n_in), (t_out, n_out) = stats["torch_op_enter"], stats["torch_op_return"]
    markers = [stats[p] for p in PROGRAMS[2:] if p in stats]
    return {"ms_per_step": float(json.loads(line)["ms_per_step"]), "ops_per_step": ops / steps,
            "ns_per_op": t_in / max(n_in, 1) + t_out / max(n_out, 1), "enter_ns": t_in / max(n_in, 1),
            "return_ns": t_out / max(n_out, 1), "marker_runs": sum(n for _, n in markers),
            "marker_ns": sum(t for t, _ in markers) / max(sum(n for _, n in markers), 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the baseline program")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (BPF)")
    variants = ("baseline", "steps off", "steps on")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    before = STATS.read_text().strip()
    with tempfile.TemporaryDirectory() as d:
        src = _baseline_src(a.baseline, Path(d))
        STATS.write_text("1")
        try:
            for _ in range(a.rounds):
                for v in variants:
                    runs[v].append(run_once(v, a.steps, src))
        finally:
            STATS.write_text(before)
    print(f"| torch receiver, CPU training loop ({a.steps} steps, median of {a.rounds}) | ms per step | "
          "op calls per step | BPF ns per op call (entry + return) | entry ns | return ns | "
          "marker runs per step, ns each | ns per op call, runs |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for v in variants:
        med = {k: statistics.median(r[k] for r in runs[v]) for k in runs[v][0]}
        per_run = ", ".join(f"{r['ns_per_op']:.0f}" for r in runs[v])
        print(f"| {v} | {med['ms_per_step']:.3f} | {med['ops_per_step']:.1f} | {med['ns_per_op']:.0f} | "
              f"{med['enter_ns']:.0f} | {med['return_ns']:.0f} | {med['marker_runs'] / a.steps:.1f}, "
              f"{med['marker_ns']:.0f} | {per_run} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
