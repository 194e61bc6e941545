"""Where the agent's CPU per span goes, by stage: ``sudo .venv/bin/python bench/span_stages.py [--rate R]``.

bench/run.py's pipeline row (cudaMemcpy on the real libcudart at ``--rate`` calls/s for ``--seconds``, a span per
call, the whole agent to the JSON-lines file), with each stage's per-batch entry point wrapped to add up the
calling thread's CPU time (``time.thread_time``; the wrappers cost one call per batch, not per span). Printed per
span, one row per stage; "incl." rows contain the rows under them. What is left of the total (the agent's user +
system CPU per span, as bench/run.py prints it) is the other threads (metrics, health) and the kernel's work on
the agent's behalf outside these calls (wakeups).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench.run as br  # noqa: E402
from otel_ebpf.bpf import records, ringread  # noqa: E402
from otel_ebpf.core import gctune, pipeline, processing  # noqa: E402
from otel_ebpf.emit import emitter, jsonfile, sending  # noqa: E402

CPU: Counter[str] = Counter()
CALLS: Counter[str] = Counter()
STAGES: list[tuple[type, str, str]] = [  # (class, method, row), in the order the rows print
    (ringread.Rings, "poll", "receiver thread: ring-buffer poll, decode, hand-on (incl.)"),
    (pipeline.BoundedQueue, "offer", "  receiver thread: pipeline queue offer"),
    (processing.EventProcessor, "consume", "pipeline thread: processor (incl.)"),
    (emitter.Emitter, "consume", "  pipeline thread: emitter (span build, sending-queue put; incl.)"),
    (sending.SendingQueue, "put", "    pipeline thread: sending-queue put"),
    (jsonfile.JsonLinesSpanExporter, "export", "export thread: encode and write (incl.)"),
    (jsonfile._LineWriter, "write", "  export thread: file write"),
]


def _wrap(cls: type, name: str, row: str) -> None:
    orig: Callable[..., Any] = getattr(cls, name)

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        try:
            return orig(self, *args, **kwargs)
        finally:
            CPU[row] += time.thread_time() - t
            CALLS[row] += 1

    setattr(cls, name, timed)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=40000, help="cudaMemcpy calls/s")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--python-decode", action="store_true",
                    help="the receiver decodes every record in Python (otel_ebpf.bpf.records.use_native = False)")
    a = ap.parse_args()
    records.use_native = not a.python_decode
    if os.geteuid() != 0:
        sys.exit("bench: needs root (BPF)")
    for cls, name, row in STAGES:
        _wrap(cls, name, row)
    gctune.tune()
    r = br.pipeline_at(br.build_loop(), a.rate, a.seconds)
    spans = max(r["spans"], 1)
    lost = ", ".join(f"{k} {v}" for k, v in sorted(r["lost"].items())) or "0"
    print(f"cudaMemcpy at {a.rate:.0f}/s (achieved {r['achieved']:.0f}) for {a.seconds:g} s: {r['spans']} spans, "
          f"lost {lost}\n\n| stage | CPU per span | calls |\n|---|---:|---:|")
    for _, _, row in STAGES:
        print(f"| {row.strip()} | {CPU[row] / spans * 1e6:.2f} us | {CALLS[row]} |")
    print(f"| **agent total (user + system, all threads)** | **{r['cpu_us_per_span']:.2f} us** | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
