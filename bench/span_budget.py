"""The CUDA receiver's span budget against what the pipeline holds: ``sudo .venv/bin/python bench/span_budget.py``.

``--processes N`` processes (the ranks of one node) each call cudaMemcpy on the real libcudart at ``--rate`` calls/s
for ``--seconds``, all traced by one agent with the default CUDA receiver (every call counted in the kernel, spans
within ``span_rate_limit`` a process, a token bucket with a burst of one second's worth). For each ``--budgets``
value it prints the spans made, what was lost (by reason) and the agent's CPU per span: the budget the pipeline
holds with zero loss when every rank of a node calls faster than its budget. Nothing is carried over between rows.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import build_loop, cudart  # noqa: E402
from otel_ebpf.core import gctune  # noqa: E402


def _start(loop: Path, n: int, rate: float) -> subprocess.Popen:
    # every loop on the last CPU, as bench/run.py pins its one loop: the agent's threads run elsewhere
    pin = ["taskset", "-c", str((os.cpu_count() or 1) - 1)] if (os.cpu_count() or 1) > 1 else []
    p = subprocess.Popen([*pin, str(loop), cudart(), "memcpy", str(n), "--wait-stdin", "--rate", str(rate)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def agent_for(pids: list[int], out_dir: str, budget: int, queue_size: int | None) -> Any:  # an Agent
    from otel_ebpf.service import settings
    from otel_ebpf.service.agent import Agent

    extra: dict = {"receivers": {"cuda": {"span_rate_limit": budget}}, "service": {
        "pipelines": {"default": {"receivers": ["cuda"], "processors": ["cuda"]}}, "metrics_interval": 1.0}}
    if queue_size:
        extra["exporters"] = {"file": {"batch": {"queue_size": queue_size}}}
    return Agent(settings.load(None, output=out_dir, extra=extra), target_pids=pids)


def run_once(loop: Path, processes: int, rate: float, seconds: float, budget: int,
             queue_size: int | None = None) -> dict:
    me = psutil.Process()
    n = int(rate * seconds)
    loops = [_start(loop, n, rate) for _ in range(processes)]
    with tempfile.TemporaryDirectory() as d:
        agent = agent_for([p.pid for p in loops], d, budget, queue_size)
        agent.start()
        gctune.freeze_startup()
        cpu0 = me.cpu_times()
        for p in loops:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        ns = []
        for p in loops:
            assert p.stdout is not None
            m = re.search(r"ns_per_call=([0-9.]+)", p.stdout.readline())
            p.wait(timeout=300)
            ns.append(float(m.group(1)) if m else float("nan"))
        time.sleep(1.5)  # > stats_interval, and the last records drained
        agent.shutdown()
        cpu1 = me.cpu_times()
        spans = agent.summary()["spans"]
        tel = agent.ctx.telemetry
    lost: Counter[str] = Counter()
    limited = 0
    for name, attrs, v in tel.snapshot():
        if name == "otel_ebpf.events.dropped" and v:
            lost[attrs.get("reason", "?")] += v
        if name == "otel_ebpf.spans.rate_limited" and v:
            limited += v
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {"budget": budget, "calls": n * processes, "spans": spans, "lost": lost, "rate_limited": limited,
            "cpu_us_per_span": cpu / max(spans, 1) * 1e6, "agent_cpu_share": cpu / seconds,
            "achieved": min(rate, 1e9 / max(ns)) if ns else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--rate", type=float, default=10000, help="cudaMemcpy calls/s of each process")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--budgets", default="2000,5000,7500", help="span_rate_limit values tried, one run each")
    ap.add_argument("--queue-size", type=int, help="the file exporter's queue_size (default: its default)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (BPF)")
    gctune.tune()
    loop = build_loop()
    print("| span_rate_limit | processes x calls/s (achieved) | spans | lost | calls without a span (counted) "
          "| agent CPU per span | agent CPU (cores) |\n|---|---|---|---|---|---|---|")
    for budget in (int(b) for b in a.budgets.split(",")):
        r = run_once(loop, a.processes, a.rate, a.seconds, budget, a.queue_size)
        lost = ", ".join(f"{k} {v}" for k, v in sorted(r["lost"].items())) or "0"
        print(f"| {budget}/s | {a.processes} x {a.rate:.0f} ({r['achieved']:.0f}) | {r['spans']} of {r['calls']} calls "
              f"| {lost} | {r['rate_limited']} | {r['cpu_us_per_span']:.1f} us | {r['agent_cpu_share']:.2f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
