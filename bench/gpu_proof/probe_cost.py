"""GPU proof, step 5a: the cost of our probe on cudaLaunchKernel of the libcudart the job's torch loads.

Three setups, interleaved round by round, medians: untraced; an empty BPF program on the same uprobe; the cuda
receiver (an Agent in this process, the loop's pid its target). The loop (launch_loop.c, built here with cc)
creates the CUDA context and warms up before it is timed. The figure that matters is receiver / empty uprobe
(docs/benchmarks.md: target <= 1.15). Needs root and BCC in this process (the agent's python)."""
from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from common import HERE, Target, run_bounded

__all__ = ["measure"]


def _libcudart(t: Target) -> str | None:
    """The libcudart.so that torch maps once CUDA is initialised (the GPU image's wheel, or the twin's stand-in)."""
    code = ("import torch; torch.cuda.init(); torch.zeros(1, device='cuda');"
            "print(next((l.split()[-1] for l in open('/proc/self/maps') if 'libcudart.so' in l), ''))")
    d = run_bounded([t.workload_python, "-c", code], 120, env=t.workload_env)
    path = d.out.strip().splitlines()[-1] if d.rc == 0 and d.out.strip() else ""
    return path or None


def _loop(lib: str, n: int, exe: Path, env: dict[str, str], setup: Any = None) -> float:
    p = subprocess.Popen([str(exe), lib, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdin is not None and p.stdout is not None
        ready = p.stdout.readline()
        if not ready.startswith("ready"):
            raise RuntimeError(f"launch_loop: {ready!r}")
        undo = setup(p.pid) if setup else None
        try:
            p.stdin.write("go\n")
            p.stdin.flush()
            line = p.stdout.readline()
            p.wait(timeout=120)
        finally:
            if undo:
                undo()
        m = re.search(r"ns_per_call=([0-9.]+)", line)
        if not m:
            raise RuntimeError(f"launch_loop printed {line!r}")
        return float(m.group(1))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def measure(t: Target, tmp: Path, budget: float) -> dict[str, Any]:
    from bcc import BPF

    from otel_ebpf.bpf.links import attach_one

    from otel_ebpf.service import settings
    from otel_ebpf.service.agent import Agent

    lib = _libcudart(t)
    if lib is None:
        return {"status": "error", "rows": [["probe cost", "no libcudart found in torch's maps", "", "ERROR"]]}
    exe = tmp / "launch_loop"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return {"status": "error",
                "rows": [["probe cost", "no C compiler (cc/gcc) to build launch_loop.c", "", "ERROR"]]}
    subprocess.run([cc, "-O1", "-o", str(exe), str(HERE / "launch_loop.c"), "-ldl"], check=True, timeout=60)
    n = 10_000 if t.quick else 200_000
    env = dict(t.workload_env)

    def bare(pid: int) -> Any:
        # attached as the receivers attach theirs (a link where the kernel has them): BCC's own uprobe would be
        # refused beside the links an earlier step's agent left to its closer (BCC's stray ref_ctr_offset)
        return attach_one(BPF(text="int bare(struct pt_regs *ctx) { return 0; }"), lib, "cudaLaunchKernel", "bare")

    def agent(pid: int) -> Any:
        d = tempfile.mkdtemp(prefix="gpu-proof-agent-", dir=tmp)
        cfg = settings.load(None, output=d, extra={"service": {
            "pipelines": {"default": {"receivers": ["cuda"], "processors": ["cuda"]}}, "metrics_interval": 1.0,
            "health_endpoint": ""}})
        a = Agent(cfg, target_pids=[pid])
        a.start()
        return a.shutdown

    runs: dict[str, list[float]] = {"untraced": [], "empty uprobe": [], "cuda receiver": []}
    for _ in range(1 if t.quick else 5):
        runs["untraced"].append(_loop(lib, n, exe, env))
        runs["empty uprobe"].append(_loop(lib, n, exe, env, bare))
        runs["cuda receiver"].append(_loop(lib, n, exe, env, agent))
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratio = med["cuda receiver"] / med["empty uprobe"]
    rows = [[f"cudaLaunchKernel, {k} (ns/call, median)", f"{v:.0f}", "", "info"] for k, v in med.items()]
    rows.append(["receiver / empty uprobe", f"{ratio:.3f}", "<= 1.15 (docs/benchmarks.md)",
                 "ok" if ratio <= 1.15 else "over target"])
    return {"status": "pass", "libcudart": lib, "calls": n, "runs": runs, "ratio": ratio, "rows": rows,
            "json": json.dumps(med)}
