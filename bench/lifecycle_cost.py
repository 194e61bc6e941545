"""What the lifecycle receiver (on by default since issue 18) costs per exec: a traced program that starts
N short-lived processes, under ``otel-ebpf run`` with the default pipeline with and without ``lifecycle``.
One command: ``sudo .venv/bin/python bench/lifecycle_cost.py [--rounds 5] [--execs 2000]``; with ``--tree NAME=DIR``
(repeatable) it compares source trees instead (the default config each, interleaved with untraced).

The program (Python, started by the agent) says it is ready, waits for SIGUSR1, times N x
``posix_spawn('/bin/true') + waitpid`` with ``perf_counter``, prints it and waits for a second SIGUSR1 before it
exits, so the agent's start (BPF compiles) and shutdown are outside both figures. Modes, interleaved round by
round so drift and the other load on the machine hit all alike:

* untraced: the program alone;
* default without lifecycle: ``otel-ebpf run --config`` with the default pipeline minus ``lifecycle``
  (cuda, nccl, nvml, blockio, memory: the default before issue 18);
* default: ``otel-ebpf run`` with the built-in default config (those plus ``lifecycle``).

Both traced modes set ``service.deferred_start: false``: every receiver is loaded before the program runs, so no
compile falls inside the measured loop.

Per mode and round: the program's wall time per exec (us), and the agent's own CPU time (user + system of all
its threads, ``/proc/PID/stat``; not the traced program's) from the first SIGUSR1 to ``--settle`` seconds after
the program's last exec (the agent's work is asynchronous: its poll threads and pipeline catch up after the
loop), per exec. On a loaded machine the agent's work also slows the program. Per mode: the median over rounds.
Prints a Markdown table; ``--json`` also writes every round.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = """
import os, signal, sys, time
n = int(sys.argv[1])
go = []
signal.signal(signal.SIGUSR1, lambda *_: go.append(1))
def wait_go():
    while not go:
        time.sleep(0.005)
    go.clear()
print(f"lifecycle-bench ready pid={os.getpid()}", flush=True)
wait_go()
t0 = time.perf_counter()
for _ in range(n):
    os.waitpid(os.posix_spawn('/bin/true', ['/bin/true'], {}), 0)
print(f"lifecycle-bench wall_ns={int((time.perf_counter() - t0) * 1e9)}", flush=True)
wait_go()
"""
READY = re.compile(r"lifecycle-bench ready pid=(\d+)")
WALL = re.compile(r"lifecycle-bench wall_ns=(\d+)")
TICK = os.sysconf("SC_CLK_TCK")
MODES = ("untraced", "default without lifecycle", "default")
# every receiver loaded before the program runs: with a deferred start the others would compile during its loop,
# and their compiles would count as the agent's CPU per exec
STEADY = {"deferred_start": False}


def _steady_config(path: Path) -> Path:
    path.write_text(yaml.safe_dump({"service": STEADY}))
    path.chmod(0o600)
    return path


def _config_without_lifecycle(path: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from otel_ebpf.service.settings import default_data

    pipe = default_data()["service"]["pipelines"]["default"]
    pipe = {k: [t for t in v if t != "lifecycle"] for k, v in pipe.items() if k in ("receivers", "processors")}
    assert len(pipe["receivers"]) == len(default_data()["service"]["pipelines"]["default"]["receivers"]) - 1
    path.write_text(yaml.safe_dump({"service": {"pipelines": {"default": pipe}, **STEADY}}))
    path.chmod(0o600)  # the agent refuses a world-writable config
    return path


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of process ``pid`` (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _line(p: subprocess.Popen[str], pattern: re.Pattern[str], mode: str) -> re.Match[str]:
    assert p.stdout is not None
    for line in p.stdout:
        m = pattern.search(line)
        if m:
            return m
    p.wait(timeout=60)
    raise SystemExit(f"{mode}: exit {p.returncode} before '{pattern.pattern}'")


def _one(mode: str, execs: int, cfg: Path, out: Path, settle: float, tree: Path | None = None) -> tuple[float, float]:
    """(program wall us per exec, agent CPU us per exec; 0 untraced). ``tree``: the otel_ebpf package to run
    (first on PYTHONPATH), default the installed one."""
    prog = [sys.executable, "-c", PROGRAM, str(execs)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EBPF_")}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(tree), env.get("PYTHONPATH", "")) if x)
    if mode == "untraced":
        argv = prog
    else:
        steady = _steady_config(out.parent / f"{out.name}-steady.yaml")
        extra = ["--config", str(cfg if mode == "default without lifecycle" else steady)]
        argv = [sys.executable, "-m", "otel_ebpf", "run", *extra, "--output", str(out), "--", *prog]
    p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        child = int(_line(p, READY, mode).group(1))
        agent = p.pid if mode != "untraced" else None
        cpu0 = _cpu_s(agent) if agent else 0.0
        os.kill(child, signal.SIGUSR1)
        wall_ns = int(_line(p, WALL, mode).group(1))
        time.sleep(settle)
        cpu1 = _cpu_s(agent) if agent else 0.0
        os.kill(child, signal.SIGUSR1)
        if p.wait(timeout=300) != 0:
            raise SystemExit(f"{mode}: exit {p.returncode}")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return wall_ns / 1e3 / execs, (cpu1 - cpu0) * 1e6 / execs



def _trees(args: argparse.Namespace) -> None:
    """--tree: untraced and each tree's default config, interleaved round by round."""
    trees = {name: Path(path).resolve() for name, _, path in (t.partition("=") for t in args.tree)}
    rows: dict[str, list[tuple[float, float]]] = {"untraced": [], **{name: [] for name in trees}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, name in enumerate(rows):
                mode = "untraced" if name == "untraced" else "default"
                rows[name].append(_one(mode, args.execs, Path(tmp) / "unused.yaml", Path(tmp) / f"out-{r}-{i}",
                                       args.settle, trees.get(name)))
                print(f"round {r + 1} {name}: {rows[name][-1][0]:.1f} us wall, {rows[name][-1][1]:.1f} us CPU "
                      "per exec", file=sys.stderr, flush=True)
    print("| tree (default config) | program wall per exec, us | agent CPU per exec, us |")
    print("|---|---|---|")
    for name, runs in rows.items():
        print(f"| {name} | {statistics.median(w for w, _ in runs):.1f} ({', '.join(f'{w:.1f}' for w, _ in runs)}) | "
              f"{statistics.median(c for _, c in runs):.1f} ({', '.join(f'{c:.1f}' for _, c in runs)}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--execs", type=int, default=2000)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds the agent may catch up after the last exec")
    ap.add_argument("--json", type=Path, help="write every round's figures here")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="instead of the modes: the default config with the otel_ebpf package in DIR (a `git archive` "
                         "of another commit plus its built .so files), interleaved with untraced (repeatable)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (the agent loads BPF programs)")
    if args.tree:
        _trees(args)
        return
    rows: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config_without_lifecycle(Path(tmp) / "no-lifecycle.yaml")
        for r in range(args.rounds):
            for mode in MODES:
                rows[mode].append(_one(mode, args.execs, cfg, Path(tmp) / f"out-{r}-{MODES.index(mode)}", args.settle))
                print(f"round {r + 1} {mode}: {rows[mode][-1][0]:.1f} us wall, {rows[mode][-1][1]:.1f} us CPU "
                      "per exec", file=sys.stderr, flush=True)
    wall = {m: statistics.median(w for w, _ in rows[m]) for m in MODES}
    cpu = {m: statistics.median(c for _, c in rows[m]) for m in MODES}
    base = "default without lifecycle"
    print(f"\n{args.rounds} rounds x {args.execs} execs, interleaved, {time.monotonic() - t0:.0f} s; "
          f"medians over rounds (each round's figures in brackets)\n")
    print("| mode | program wall per exec, us | agent CPU per exec, us |")
    print("|---|---|---|")
    for m in MODES:
        print(f"| {m} | {wall[m]:.1f} ({', '.join(f'{w:.1f}' for w, _ in rows[m])}) | "
              f"{cpu[m]:.1f} ({', '.join(f'{c:.1f}' for _, c in rows[m])}) |")
    print(f"\nlifecycle on / off: wall x{wall['default'] / wall[base]:.2f} "
          f"({wall['default'] - wall[base]:+.1f} us per exec), agent CPU x{cpu['default'] / cpu[base]:.2f} "
          f"({cpu['default'] - cpu[base]:+.1f} us per exec)")
    if args.json:
        args.json.write_text(json.dumps({"execs": args.execs, "rounds": rows}, indent=1))


if __name__ == "__main__":
    main()

