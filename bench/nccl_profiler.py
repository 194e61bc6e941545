"""NCCL profiler plugin cost per collective: ``.venv/bin/python bench/nccl_profiler.py [--rounds 15]`` (as root).

The driver of tests/nccl_profiler (driver.c, nccl_sim.c: NCCL 2.28.9's profiler-plugin side, modelled) runs
implicit-group all-reduces (one ncclAllReduce call each: the GroupApi, CollApi, Group, Coll, KernelCh calls NCCL
makes for it, with NCCL's mask checks) in a C loop, kernel-channel events on the calling thread, in three
processes pinned to one CPU and measured in interleaved rounds:

* ``none``: no plugin (NCCL without NCCL_PROFILER_PLUGIN): the model's own cost, the baseline;
* ``empty plugin``: a plugin that asks for GroupApi only and returns NULL handles: NCCL's call itself;
* ``plugin``: libnccl-profiler-otel_ebpf as built by setup.py, no agent: NCCL's mask is GroupApi, so one plugin call
  per collective (plugin - none = the cost of one group API event);
* ``plugin+agent``: the same with tests/nccl_profiler/collect.bpf.c attached to all its USDT probes through BCC
  (built with BENCH_NO_OUTPUT: each hit reads its arguments and copies its record, but submits nothing, so the
  receiver's ring buffer and user-space read are not in the figure): 12 probe hits per collective (api_start,
  group_start, coll_start, 2 kernel_ch_start, 2 kernel_ch_stop, 5 event_stop);
* ``plugin+receiver's probes``: the same collector attached only to the probes the agent's NCCL receiver attaches
  (``receivers/nccl/profiler.py`` HANDLERS: no group_start, no event_stop, whose semaphores then stay 0, so the
  plugin does not fire them): 6 hits per collective (api_start, coll_start, 2 kernel_ch_start, 2 kernel_ch_stop),
  what a traced job pays.

Prints a Markdown table with the machine, its load average, and every round's figure.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.nccl_profiler.conftest import ABI_DIR, HERE, Driver  # noqa: E402


# The least a plugin can do: GroupApi only, every start a NULL handle. NCCL's call itself, for comparison.
EMPTY_PLUGIN = r"""
#include "nccl/profiler.h"
static ncclResult_t init(void **c, uint64_t id, int *m, const char *n, int nn, int nr, int r, ncclDebugLogger_t l)
{ (void)id; (void)n; (void)nn; (void)nr; (void)r; (void)l; static int ctx; *c = &ctx; *m = ncclProfileGroupApi;
  return ncclSuccess; }
static ncclResult_t start(void *c, void **h, ncclProfilerEventDescr_v5_t *d) { (void)c; (void)d; *h = 0;
  return ncclSuccess; }
static ncclResult_t stop(void *h) { (void)h; return ncclSuccess; }
static ncclResult_t rec(void *h, ncclProfilerEventState_v5_t s, ncclProfilerEventStateArgs_v5_t *a)
{ (void)h; (void)s; (void)a; return ncclSuccess; }
static ncclResult_t fin(void *c) { (void)c; return ncclSuccess; }
__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {"empty", init, start, stop, rec, fin};
"""


def build_empty_plugin(tmp: Path) -> Path:
    src, out = tmp / "empty.c", tmp / "libnccl-profiler-empty.so"
    src.write_text(EMPTY_PLUGIN)
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", f"-I{ABI_DIR}", "-o", str(out), str(src)], check=True,
                   timeout=120)
    return out


def build_driver(tmp: Path) -> Path:
    out = tmp / "driver"
    subprocess.run(["gcc", "-O2", "-fno-omit-frame-pointer", f"-I{ABI_DIR}", "-o", str(out), str(HERE / "driver.c"),
                    str(HERE / "nccl_sim.c"), "-ldl", "-lpthread"], check=True, timeout=120)
    return out


class Inline(Driver):
    """A driver with its kernel-channel events on the calling thread (no proxy hand-off in the loop)."""

    def __init__(self, exe: Path, plugin: Path | None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EBPF_NCCL")}
        wrapper = exe.with_name("driver-inline")
        if not wrapper.exists():
            wrapper.write_text(f'#!/bin/sh\nexec "{exe}" "$1" "$2" inline\n')
            wrapper.chmod(0o755)
        super().__init__(wrapper, plugin, 5, env, timeout=300)
        os.sched_setaffinity(self.pid, {(os.cpu_count() or 1) - 1})  # one CPU, the same for every mode
        self.run("init 0x1234abcd 0 2 bench")

    def bench(self, n: int) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"bench {n} 1\n")
        self.proc.stdin.flush()
        msg = self._line()
        self._line()  # {"done": ...}
        return float(msg["bench"][0])


def attach(pid: int, probes: tuple[str, ...]) -> tuple[object, object]:
    """BCC on ``probes`` of ``pid``. Keep both: dropping the USDT object lowers the semaphores it raised."""
    from bcc import BPF, USDT

    u = USDT(pid=pid)
    for probe in probes:
        u.enable_probe(probe=probe, fn_name=f"on_{probe}")
    return BPF(src_file=str(HERE / "collect.bpf.c"), cflags=[f"-I{ABI_DIR}", "-DBENCH_NO_OUTPUT"],
               usdt_contexts=[u]), u


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=2_000_000, help="collectives per round without an agent")
    p.add_argument("--agent-calls", type=int, default=20_000, help="collectives per round with the agent")
    a = p.parse_args()
    from otel_ebpf.nccl_profiler import PROBES, require_plugin
    from otel_ebpf.receivers.nccl.profiler import HANDLERS

    plugin = require_plugin()
    agents = {"plugin+agent": PROBES, "plugin+receiver's probes": tuple(HANDLERS)}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_driver(Path(tmp))
        drivers = {"none": Inline(exe, None), "empty plugin": Inline(exe, build_empty_plugin(Path(tmp))),
                   "plugin": Inline(exe, plugin), **{m: Inline(exe, plugin) for m in agents}}
        bpfs = [attach(drivers[m].pid, probes) for m, probes in agents.items()]
        for m in agents:
            mask, _ = drivers[m].run("single 0")  # the first group after the attach widens NCCL's mask
            assert mask == 0x747, f"the agent's attach did not widen NCCL's mask ({mask:#x})"
        rounds: dict[str, list[float]] = {m: [] for m in drivers}
        for _ in range(a.rounds):
            for mode, d in drivers.items():
                rounds[mode].append(d.bench(a.agent_calls if mode in agents else a.calls))
        del bpfs
        for d in drivers.values():
            d.close()
    med = {m: statistics.median(v) for m, v in rounds.items()}
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"{os.cpu_count()} vCPU {cpu}, kernel {platform.release()}, load average before the run "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {a.rounds} interleaved rounds, medians\n")
    print("| mode | ns per collective | added by the plugin (median of the rounds' differences) | / none | "
          "rounds (ns) |")
    print("|---|---:|---:|---:|---|")
    for mode, v in rounds.items():
        diffs = [x - base for x, base in zip(v, rounds["none"], strict=True)]  # same round: same machine load
        added = "-" if mode == "none" else f"{statistics.median(diffs):.1f} ns"
        print(f"| {mode} | {med[mode]:.1f} | {added} | {med[mode] / med['none']:.3f} | "
              f"{', '.join(f'{x:.1f}' for x in v)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
