"""What detaching a receiver's uprobes costs: ``sudo .venv/bin/python bench/detach.py [--probes 96] [--rounds 3]``.

``--probes`` empty programs on as many functions of NVIDIA's libcudart (entries, every other one a return), attached
three ways, then detached, timing the detach only:

* BCC's perf-event uprobes, closed one after another (what ``BPF.cleanup`` does);
* the same, closed from 32 threads at once;
* uprobe_multi links (otel_ebpf.bpf.links), closed from 32 threads at once, as ``UprobeLinks.close`` does.

Rounds are interleaved; the median and range are printed, as Markdown rows.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import cudart  # noqa: E402
from otel_ebpf.bpf import links  # noqa: E402


def _symbols(path: str, n: int) -> list[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    return sorted({s.split("@")[0] for s in out.split() if s.startswith("cuda")})[:n]


def _program(n: int) -> Any:  # a bcc.BPF
    from bcc import BPF

    return BPF(text="\n".join(f"int f{i}(struct pt_regs *ctx) {{ return 0; }}" for i in range(n)))


def perf_round(path: str, syms: list[str], threads: int) -> float:
    from bcc import libbcc

    b = _program(len(syms))
    for i, s in enumerate(syms):
        (b.attach_uretprobe if i % 2 else b.attach_uprobe)(name=path, sym=s, fn_name=f"f{i}")
    fds = list(b.uprobe_fds.values())
    t = time.perf_counter()
    if threads == 1:
        for fd in fds:
            libbcc.lib.bpf_close_perf_event_fd(fd)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(libbcc.lib.bpf_close_perf_event_fd, fds))
    took = time.perf_counter() - t
    for ev in list(b.uprobe_fds):
        libbcc.lib.bpf_detach_uprobe(ev)
        b._del_uprobe_fd(ev)
    b.cleanup()
    return took


def links_round(path: str, syms: list[str]) -> float:
    b = _program(len(syms))
    ul = links.UprobeLinks(b)
    for i, s in enumerate(syms):
        if not ul.attach(path, s, f"f{i}", ret=bool(i % 2)):
            sys.exit("bench: this kernel refused uprobe_multi links")
    assert len(ul) == len(syms)
    t = time.perf_counter()
    ul.close()
    took = time.perf_counter() - t
    b.cleanup()
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probes", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (BPF)")
    path = cudart()
    syms = _symbols(path, a.probes)
    runs: dict[str, list[float]] = {"perf, one after another": [], "perf, 32 threads": [], "links, 32 threads": []}
    for _ in range(a.rounds):
        runs["perf, one after another"].append(perf_round(path, syms, 1))
        runs["perf, 32 threads"].append(perf_round(path, syms, 32))
        runs["links, 32 threads"].append(links_round(path, syms))
    print(f"| detach of {len(syms)} uprobes on libcudart ({a.rounds} interleaved rounds, {os.uname().release}) "
          "| median [range] |\n|---|---|")
    for k, v in runs.items():
        print(f"| {k} | {statistics.median(v):.2f} s [{min(v):.2f}-{max(v):.2f}] |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
