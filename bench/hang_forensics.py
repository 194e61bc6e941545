"""Persistent stragglers and hangs on the twin, measured at the gateway's output (issue 17).
One command: ``sudo .venv/bin/python bench/hang_forensics.py [--jobs 17] [--trials 6] [--hangs 10] [--budget-min 60]``.

Real PyTorch 2.11 FSDP2 on the twin's stand-ins, 2 namespace nodes x 2 ranks (``otel_ebpf.twin.cluster``: an agent
per node with the cuda, nccl, nccl_watch and sched pipeline, one gateway with the collective join at its defaults
but ``desync_timeout`` 2 s; every exporter's batch delay 200 ms).

* **Stragglers** (``tests/twin/programs/wl_straggle.py``): each job runs ``--trials`` trials after a warm-up and a
  clean lead-in, half of them (shuffled) with one random rank slowed by ``--slow-frac`` of the step on every step
  for ``--slow-s``, the others with nobody slowed for as long; each trial ends with ``--clean-s`` clean. Every
  rank's step gets noise ``U(0, --noise-frac x step)`` on every step. A step is ``--compute-ms`` of modelled
  device time (a sleep: the twin's kernels take none) plus the host's FSDP2 work. The gateway's
  ``otel_ebpf.nccl.straggler`` records (logs.jsonl) are read back: a ``raised`` one from a trial's first slowed step
  to ``GRACE_S`` after its last names the right rank or a wrong one; a trial with none is missed; a trial with
  nobody slowed and a ``raised`` record in it is a false alarm (so is one in a clean stretch, counted apart).
  Detection latency: from the slowed rank's first slowed step (its own clock, the program's record) to the raised
  record's time (the gateway's clock: the same host).
* **Hangs** (``tests/twin/programs/wl_hang.py``): rank ``i mod 4`` of run ``i`` stalls ``--stall-s`` in
  ``stuck_in_dataloader_fetch`` after 3 good steps while its peers wait in an all-reduce. Measured: from the
  stall's start (the program's record) to its agent's ``otel_ebpf.nccl.rank.stack`` record naming the function
  (the record's time: when the capture was turned into records), and to the gateway's ``otel_ebpf.nccl.desync``
  record naming it (the gateway's time: when it had it).

Runs stop being started once ``--budget-min`` has passed; the N reported is what finished (a job that fails is
reported, not measured). Prints a Markdown table and writes every trial's figures to ``OUT/results.json`` (``--out``,
default a new temporary folder; each job's own output is removed once read, kept when it failed). The load average
is sampled before each job.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_ebpf.report.otlpfiles import LogRow, read_otlp_json  # noqa: E402
from otel_ebpf.twin.cluster import ClusterSpec, run_cluster  # noqa: E402

PROGRAMS = ROOT / "tests" / "twin" / "programs"
STRAGGLER, DESYNC, STACK = "otel_ebpf.nccl.straggler", "otel_ebpf.nccl.desync", "otel_ebpf.nccl.rank.stack"
CULPRIT = "stuck_in_dataloader_fetch"
GRACE_S = 2.0  # after a trial's last slowed step: the window's last entries and the exports (200 ms each hop)


@dataclass
class Trial:
    job: int
    rank: int  # the slowed global rank, -1: nobody
    outcome: str  # right, wrong, missed (slowed); clean, false_alarm (nobody)
    latency_s: float | None = None
    raised: list[int] = field(default_factory=list)  # ranks raised in the trial's window
    base_ms: float = 0.0


@dataclass
class Hang:
    run: int
    rank: int
    to_stack_s: float | None
    to_desync_s: float | None
    function: str


def _cluster(program: str, out: Path, args: list[str], timeout: float) -> tuple[list[LogRow], Path]:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    run = run_cluster(ClusterSpec(PROGRAMS / program, [str(out), *args], output=out / "gateway", timeout=timeout))
    if run.returncodes != {0: 0, 1: 0} or run.timed_out or run.problems:
        raise RuntimeError(f"{program} failed: {run.returncodes} timed out {run.timed_out} {run.problems} "
                           f"(see {out / 'gateway' / 'logs'})")
    return read_otlp_json(out / "gateway" / "logs.jsonl").logs, out


def _schedule(rng: random.Random, trials: int) -> list[int]:
    """Half the trials with a random slowed rank, half with nobody, shuffled."""
    plan = [rng.randrange(4) for _ in range(trials - trials // 2)] + [-1] * (trials // 2)
    rng.shuffle(plan)
    return plan


@dataclass
class Clean:
    """Raises outside every trial's window: in the clean stretches after slowed trials (from ``GRACE_S`` after the
    last slowed step: ``seconds`` of them in all) and before the first trial (warm-up and lead-in)."""

    raises: int = 0
    seconds: float = 0.0
    lead_in: int = 0


def _classify(job: int, notes: dict[int, Any], raised: list[LogRow], clean: Clean) -> list[Trial]:
    """The job's trials from the ranks' records and the raised records; raises outside them go to ``clean``."""
    out: list[Trial] = []
    used: set[int] = set()
    base_ms = notes[0]["base_ns"] / 1e6
    for i, t in enumerate(notes[0]["trials"]):
        rank = int(t["rank"])
        own = notes[rank]["trials"][i] if rank >= 0 else t  # the slowed rank's own clock for its trial
        lo = own["start_ns"]
        hi = (own["slow_end_ns"] + int(GRACE_S * 1e9)) if rank >= 0 else own["end_ns"]
        mine = [r for r in raised if lo <= r.time_ns < hi]
        used.update(id(r) for r in mine)
        ranks = [int(r.attributes["nccl.rank"]) for r in mine]
        if rank >= 0:
            clean.seconds += max(0, own["end_ns"] - hi) / 1e9
        if rank < 0:
            out.append(Trial(job, rank, "false_alarm" if mine else "clean", raised=ranks, base_ms=base_ms))
        elif not mine:
            out.append(Trial(job, rank, "missed", base_ms=base_ms))
        else:
            first = min(mine, key=lambda r: r.time_ns)
            right = int(first.attributes["nccl.rank"]) == rank
            out.append(Trial(job, rank, "right" if right else "wrong", (first.time_ns - lo) / 1e9, ranks,
                             base_ms))
    first = notes[0]["trials"][0]["start_ns"]
    clean.lead_in += sum(1 for r in raised if id(r) not in used and r.time_ns < first)
    clean.raises += sum(1 for r in raised if id(r) not in used and r.time_ns >= first)
    return out


def straggler_job(job: int, args: argparse.Namespace, rng: random.Random, work: Path, clean: Clean) -> list[Trial]:
    plan = _schedule(rng, args.trials)
    argv = [f"--trials={','.join(map(str, plan))}", "--slow-frac", str(args.slow_frac), "--noise-frac",
            str(args.noise_frac), "--compute-ms", str(args.compute_ms), "--warmup-steps", "8", "--lead-s",
            str(args.clean_s), "--slow-s", str(args.slow_s), "--clean-s", str(args.clean_s), "--seed", str(job)]
    timeout = 120 + args.trials * (args.slow_s + args.clean_s) * 2
    logs, out = _cluster("wl_straggle.py", work / f"job{job}", argv, timeout)
    notes = {r: json.loads((out / f"trials{r}.json").read_text()) for r in range(4)}
    raised = [r for r in logs if r.event_name == STRAGGLER and r.attributes.get("nccl.straggler.state") == "raised"]
    return _classify(job, notes, raised, clean)


def hang_run(i: int, args: argparse.Namespace, work: Path) -> Hang:
    rank = i % 4
    logs, out = _cluster("wl_hang.py", work / f"hang{i}", ["--steps", "5", "--stuck-rank", str(rank),
                                                             "--stuck-step", "3", "--stall", str(args.stall_s)], 300)
    note = json.loads((out / "hang.json").read_text())
    pid = (str(note["host"]), int(note["pid"]))
    stacks = [r for r in logs if r.event_name == STACK and
              (str(r.resource.get("host.name")), int(r.resource.get("process.pid", -1))) == pid]
    named = [r for r in stacks if r.attributes.get("code.function.name") == CULPRIT]
    desyncs = [r for r in logs if r.event_name == DESYNC and rank in r.attributes.get("nccl.missing_ranks", ())
               and any(CULPRIT in f for f in r.attributes.get("nccl.missing.functions", ()))]
    first = min((r.time_ns for r in named), default=None)
    gateway = min((r.time_ns for r in desyncs), default=None)
    function = str(min(stacks, key=lambda r: r.time_ns).attributes.get("code.function.name")) if stacks else "-"
    return Hang(i, rank, None if first is None else (first - note["start_ns"]) / 1e9,
                None if gateway is None else (gateway - note["start_ns"]) / 1e9, function)


def _q(values: list[float], q: float) -> float:
    """Nearest-rank quantile (q in 0..1) of a non-empty list: with fewer than 100 values p99 is the maximum."""
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    return (f"{statistics.median(values):.2f} / {_q(values, 0.9):.2f} / {_q(values, 0.99):.2f} "
            f"(max {max(values):.2f}, n={len(values)})")


def report(trials: list[Trial], clean: Clean, hangs: list[Hang], loads: list[float], args: argparse.Namespace) -> str:
    slowed = [t for t in trials if t.rank >= 0]
    nobody = [t for t in trials if t.rank < 0]
    count = {k: sum(t.outcome == k for t in trials) for k in ("right", "wrong", "missed", "false_alarm")}
    latencies = [t.latency_s for t in slowed if t.outcome == "right" and t.latency_s is not None]
    jobs = len({t.job for t in trials})
    base = statistics.median(t.base_ms for t in trials) if trials else 0.0
    lines = [
        f"Stragglers: {len(trials)} trials in {jobs} jobs; step {base:.0f} ms (median of the jobs' warm-up), slowed "
        f"rank +{args.slow_frac:.0%} of the step, noise U(0, {args.noise_frac:.0%}) per rank and step; load average "
        f"before each job {min(loads, default=0):.1f}-{max(loads, default=0):.1f} (median "
        f"{statistics.median(loads) if loads else 0:.1f}).", "",
        "| measure | result | target |", "|---|---|---|",
        f"| right rank named (slowed trials) | {count['right']} of {len(slowed)} (wrong {count['wrong']}, missed "
        f"{count['missed']}) | >= 99 % |",
        f"| false alarms (trials with nobody slowed) | {count['false_alarm']} of {len(nobody)} | <= 1 % |",
        f"| raised in the clean stretches after slowed trials ({clean.seconds:.0f} s in all) | {clean.raises} | - |",
        f"| raised before the first trial (warm-up and {args.clean_s:g} s lead-in of each job) | {clean.lead_in} | - |",
        f"| detection latency, s: median / p90 / p99 | {_stats(latencies)} | p99 <= 5 s |"]
    if hangs:
        to_stack = [h.to_stack_s for h in hangs if h.to_stack_s is not None]
        to_desync = [h.to_desync_s for h in hangs if h.to_desync_s is not None]
        named = sum(h.function == CULPRIT for h in hangs)
        lines += [
            f"| hang -> stuck rank's stack record, s ({len(hangs)} runs, stall {args.stall_s:g} s; named in "
            f"{named}) | {_stats(to_stack)} | <= 15 s |",
            f"| hang -> gateway desync record naming the function, s | {_stats(to_desync)} | - |"]
    return "\n".join(lines)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=17)
    p.add_argument("--trials", type=int, default=6, help="trials per straggler job (half with nobody slowed)")
    p.add_argument("--hangs", type=int, default=10)
    p.add_argument("--slow-frac", type=float, default=0.05)
    p.add_argument("--noise-frac", type=float, default=0.05)
    p.add_argument("--compute-ms", type=float, default=300.0)
    p.add_argument("--slow-s", type=float, default=6.0)
    p.add_argument("--clean-s", type=float, default=6.0)
    p.add_argument("--stall-s", type=float, default=16.0)
    p.add_argument("--budget-min", type=float, default=60.0, help="no job is started after this many minutes")
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--out", type=Path, default=None, help="work folder (default: a new temporary one)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if os.geteuid() != 0:
        print("run it as root (namespace nodes, BPF)", file=sys.stderr)
        return 2
    args.out = args.out or Path(tempfile.mkdtemp(prefix="otel-ebpf-hang-forensics-"))
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.budget_min * 60
    trials: list[Trial] = []
    hangs: list[Hang] = []
    loads: list[float] = []
    clean = Clean()
    failed: list[str] = []
    args.out.mkdir(parents=True, exist_ok=True)
    # interleaved, so drift in the machine's load hits both alike
    order = [("straggler", j) for j in range(args.jobs)] + [("hang", i) for i in range(args.hangs)]
    order.sort(key=lambda kind_i: kind_i[1] / (args.jobs if kind_i[0] == "straggler" else max(1, args.hangs)))
    for kind, i in order:
        if time.monotonic() > deadline:
            print(f"budget spent: {kind} {i} and later not run", file=sys.stderr)
            break
        loads.append(os.getloadavg()[0])
        started = time.monotonic()
        try:
            if kind == "straggler":
                got = straggler_job(i, args, rng, args.out, clean)
                trials += got
                said = ", ".join(f"{t.rank}:{t.outcome}" + (f" {t.latency_s:.2f}s" if t.latency_s else "")
                                 for t in got)
            else:
                hangs.append(hang_run(i, args, args.out))
                said = str(asdict(hangs[-1]))
        except RuntimeError as exc:  # a job that failed is reported, not measured
            failed.append(f"{kind} {i}: {exc}")
            said = f"FAILED: {exc}"
        print(f"{kind} {i} ({time.monotonic() - started:.0f} s, load {loads[-1]:.1f}): {said}", file=sys.stderr)
        if not said.startswith("FAILED"):
            shutil.rmtree(args.out / (f"job{i}" if kind == "straggler" else f"hang{i}"), ignore_errors=True)
        (args.out / "results.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                           "trials": [asdict(t) for t in trials],
                                                           "clean": asdict(clean), "loads": loads, "failed": failed,
                                                           "hangs": [asdict(h) for h in hangs]}, indent=1))
    print(report(trials, clean, hangs, loads, args))
    if failed:
        print(f"\n{len(failed)} jobs failed (not measured): " + "; ".join(failed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
