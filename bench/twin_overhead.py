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
  the plugin's events and the agent's GPU spans cost;
* plugin, probes only: untraced, the job loads the plugin, and this benchmark attaches BPF functions to the
  probes the agent's NCCL receiver uses (``receivers/nccl/profiler.py``'s own reader of each probe's arguments,
  then a per-CPU hit counter: no record), by path with their semaphores, as the receiver does. So the job pays
  what a traced job pays for the plugin (the uprobe traps, NCCL's profiler work under the wide mask) and no
  agent shares its CPUs: plugin, probes only minus plugin, no agent is the job's side of the cost;
* wide plugin, no probes: untraced, the job loads a plugin (built here, ``WIDE_PLUGIN``) that asks NCCL for what
  ours asks for while an agent listens (GroupApi, CollApi, P2pApi, Group, Coll, P2p, KernelCh) and does nothing
  with the events: NCCL's own profiler work under that mask, without a probe. Probes only minus this is what the
  uprobe traps cost.

A step's time is the interval between rank 0's consecutive ``oe-demo step`` lines, stamped as they arrive
(the program's output is unbuffered); the first ``--warmup`` steps are left out (communicator set-up, first
allocation). Per mode: the median over rounds of each round's median step. What this measures is host time:
the twin's kernels do nothing and its NCCL moves data through shared memory, so the step is almost all host
work (Python, torch's dispatcher, the NCCL calls) — the worst case for a probe's relative cost, since on a
GPU the host usually waits for the device. Prints a Markdown table.

Wall time on a VM with fewer CPUs than ranks moves by 15-30 % between rounds, more than a probe's cost; so each
job also reports CPU time per step, read from ``/proc`` (psutil) at rank 0's step lines: the ranks' CPU (every
thread of every ``train.py`` process: user + system, which holds the uprobe traps the job pays for) and the
agent's (``otel-ebpf run`` and its threads), each over the same timed steps, divided by the steps and ranks.
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

import psutil
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
PLUGIN_MODES = ("untraced", "plugin, no agent", "wide plugin, no probes", "plugin, probes only",
                "traced, no GPU time", "traced")
# GroupApi|CollApi|P2pApi|Group|Coll|P2p|KernelCh (otel_ebpf/nccl_profiler/plugin.c OE_MASK_WIDE); handles are
# non-NULL, as ours are, so NCCL records and stops every event
WIDE_PLUGIN = r"""
#include "nccl/profiler.h"
static ncclResult_t init(void **c, uint64_t id, int *m, const char *n, int nn, int nr, int r, ncclDebugLogger_t l)
{ (void)id; (void)n; (void)nn; (void)nr; (void)r; (void)l; static int ctx; *c = &ctx; *m = 0x747;
  return ncclSuccess; }
static ncclResult_t start(void *c, void **h, ncclProfilerEventDescr_v5_t *d) { (void)c; (void)d; *h = (void *)1;
  return ncclSuccess; }
static ncclResult_t stop(void *h) { (void)h; return ncclSuccess; }
static ncclResult_t rec(void *h, ncclProfilerEventState_v5_t s, ncclProfilerEventStateArgs_v5_t *a)
{ (void)h; (void)s; (void)a; return ncclSuccess; }
static ncclResult_t fin(void *c) { (void)c; return ncclSuccess; }
__attribute__((visibility("default"))) ncclProfiler_v5_t ncclProfiler_v5 = {"wide", init, start, stop, rec, fin};
"""


def _wide_plugin(tmp: Path) -> Path:
    from otel_ebpf import nccl_profiler

    src, out = tmp / "wide.c", tmp / "libnccl-profiler-wide.so"
    if not out.exists():
        src.write_text(WIDE_PLUGIN)
        subprocess.run(["gcc", "-O2", "-fPIC", "-shared", f"-I{Path(nccl_profiler.__file__).parent}", "-o",
                        str(out), str(src)], check=True, timeout=120)
    return out
_NOOP = {"nprof_comm_init": 2, "nprof_comm_finalize": 1, "nprof_api_start": 2, "nprof_coll_start": 2,
         "nprof_p2p_start": 2, "nprof_kernel_ch_start": 4, "nprof_kernel_ch_stop": 2}


_COUNTER = """#include <uapi/linux/ptrace.h>
BPF_PERCPU_ARRAY(hits, u64, 1);
static inline int hit(void) { u32 k = 0; u64 *v = hits.lookup(&k); if (v) (*v)++; return 0; }
"""


class _PluginProbesOnly:
    """The receiver's probes on the plugin, each a BPF function that reads its arguments and returns 0."""

    def __init__(self, plugin: Path) -> None:
        from bcc import BPF

        from otel_ebpf.receivers.nccl.profiler import PluginProbes

        self.probes = PluginProbes()
        self.probes.learn(str(plugin))
        stubs = "".join(f"static inline int {fn}({', '.join(f'u64 a{i}' for i in range(n))}) {{ return hit(); }}\n"
                        for fn, n in _NOOP.items())
        self.bpf = BPF(text=_COUNTER + stubs + self.probes.source())
        self.attached = self.probes.attach(self.bpf, str(plugin))

    def hits(self) -> int:
        return int(sum(self.bpf["hits"][0]))

    def close(self) -> None:
        self.probes.close()
        self.bpf.cleanup()


def _cpu_seconds(root: int) -> tuple[float, float]:
    """(ranks, agent): CPU seconds so far of the ``train.py`` ranks under ``root`` and of ``root`` itself when it
    is the agent (``otel_ebpf run``), 0 when it is not."""
    ranks = agent = 0.0
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0, 0.0
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
            t = p.cpu_times()
        except psutil.Error:
            continue
        if "otel_ebpf" in cmd and " run " in cmd:
            agent += t.user + t.system
        elif "train.py" in cmd and "torch.distributed.run" not in cmd:
            ranks += t.user + t.system
    return ranks, agent


def run_once(mode: str, ranks: int, steps: int, warmup: int, tmp: Path, timeout: float,
             pipeline: list[str] = PIPELINE) -> tuple[float, float, float]:
    """One job in ``mode`` (module doc): (median step time, ranks' CPU per rank and step, agent's CPU per step),
    in seconds, over rank 0's step lines after ``warmup``."""
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
    probes_only = None
    if mode.startswith("plugin"):
        env[NCCL_ENV] = str(require_plugin())
    if mode == "wide plugin, no probes":
        env[NCCL_ENV] = str(_wide_plugin(tmp))
    if mode == "plugin, probes only":
        probes_only = _PluginProbesOnly(require_plugin())
    if mode.startswith("traced"):
        cfg = _agent_config(tmp / "agent.yaml", libdir, pipeline, gpu_time=mode == "traced")
        out = tmp / f"traced-{time.monotonic_ns()}"
        argv = [sys.executable, "-m", "otel_ebpf", "run", "--quiet", "--config", str(cfg), "--output", str(out),
                "--", *job]
    stamps: dict[int, float] = {}
    cpu: dict[int, tuple[float, float]] = {}
    hits: dict[int, int] = {}
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
                cpu[int(m.group(1))] = _cpu_seconds(proc.pid)
                if probes_only is not None:
                    hits[int(m.group(1))] = probes_only.hits()
            tail.append(line)
            if time.monotonic() > deadline:
                os.killpg(proc.pid, 9)
                raise RuntimeError(f"the job ran past {timeout:.0f}s")
        if proc.wait(timeout=max(1.0, deadline - time.monotonic())) != 0:
            raise RuntimeError(f"the job exited {proc.returncode}:\n{''.join(tail)}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if probes_only is not None:
            probes_only.close()
    ks = sorted(k for k in stamps if k > warmup)
    gaps = [stamps[k] - stamps[k - 1] for k in ks if k - 1 in stamps]
    if len(gaps) < 3:
        raise RuntimeError(f"only {len(gaps)} timed steps (rank 0 printed {len(stamps)} step lines)")
    first, last = ks[0] - 1, ks[-1]
    n = last - first
    job_cpu = (cpu[last][0] - cpu[first][0]) / n / ranks
    agent_cpu = (cpu[last][1] - cpu[first][1]) / n
    if hits:
        print(f"  probe hits per rank and step: {(hits[last] - hits[first]) / n / ranks:.1f}", file=sys.stderr)
    return statistics.median(gaps), job_cpu, agent_cpu


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
    results: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="otel-ebpf-bench-") as d:
        for r in range(a.rounds):
            for mode in modes if r % 2 == 0 else tuple(reversed(modes)):
                step = run_once(mode, a.ranks, a.steps, a.warmup, Path(d), a.timeout, a.pipeline.split(","))
                results[mode].append(step)
                print(f"round {r + 1}/{a.rounds} {mode}: {step[0] * 1000:.1f} ms/step, rank CPU "
                      f"{step[1] * 1000:.2f} ms/step, agent CPU {step[2] * 1000:.2f} ms/step",
                      file=sys.stderr, flush=True)
    print(_table(results, f"{a.pipeline}; {a.ranks} ranks, {a.steps} steps, {a.rounds} rounds"))
    return 0


def _table(results: dict[str, list[tuple[float, float, float]]], what: str) -> str:
    """Markdown: per mode the median over rounds of wall ms per step, a rank's CPU ms per step and the agent's."""
    def col(mode: str, i: int) -> tuple[float, str]:
        vals = [r[i] * 1000 for r in results[mode]]
        return statistics.median(vals), ", ".join(f"{v:.1f}" if i == 0 else f"{v:.2f}" for v in vals)
    base_wall, base_cpu = col("untraced", 0)[0], col("untraced", 1)[0]
    rows = [f"| mode ({what}) | ms per step (rounds) | vs untraced | a rank's CPU ms per step (rounds) "
            "| vs untraced | agent CPU ms per step |", "|---|---:|---:|---:|---:|---:|"]
    for mode in results:
        (wall, walls), (job, jobs), (agent, _) = col(mode, 0), col(mode, 1), col(mode, 2)
        rows.append(f"| {mode} | {wall:.1f} ({walls}) | {wall / base_wall:.3f} | {job:.2f} ({jobs}) "
                    f"| {job / base_cpu:.3f} | {agent:.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
