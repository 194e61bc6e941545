"""``otel-ebpf run -- CMD``: how long until the command's first instruction, and from its exit to the prompt.

    sudo .venv/bin/python bench/startup.py [--rounds 5] [--tree NAME=DIR ...] [--config FILE] [--json FILE]
    sudo .venv/bin/python bench/startup.py --compile cuda,nccl,torch,apptrace,blockio [--tree ...]

Each round runs ``python -m otel_ebpf run --output TMP -- sh -c 'date +%s%N >START; date +%s%N >END'`` with
the default config, stdout and stderr on one pipe (as ``otel-ebpf run -- CMD | tee log`` has them), and takes:

* **start**: from just before the agent is spawned to the command's first ``date`` (CLOCK_REALTIME on both
  sides; ``sh`` + one fork/exec of ``date`` are in it, ~2-5 ms);
* **to EOF**: from the command's last ``date`` to the pipe's end of file: what a ``| tee`` or a shell's
  command substitution waits for (every process holding the pipe's write end has closed it);
* **to exit**: from the command's last ``date`` to the agent process's exit (what the shell waits for
  without a pipe).

``--compile cuda,nccl,...`` measures instead what each receiver's BPF program costs to compile and load
(``BPF(text=...)`` with the receiver's own source and ``-D`` flags, its tracepoints loaded and attached with it;
default configs, tracing this process): wall and CPU time of this process (clang runs in it, the verifier in
its system calls), and the instructions the verifier walked for the programs loaded with it (fdinfo's
verified_insns: unlike the times, not moved by the machine's load), one fresh interpreter per measurement,
interleaved in the same way.

``--tree NAME=DIR`` runs the ``otel_ebpf`` package found in DIR (put first on PYTHONPATH) instead of the
installed one, so a copy of an older commit (``git archive COMMIT | tar -x -C DIR``, plus its built
``.so`` files) can be measured interleaved with the current tree: round 1 of every tree, then round 2, ...
The machine's load is shared by every tree alike. Prints one line per run and median [min-max] per tree.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["compile_once", "main", "measure_once"]

COMMAND = ["sh", "-c", 'date +%s%N > "$OE_BENCH_DIR/start"; date +%s%N > "$OE_BENCH_DIR/end"']


def measure_once(tree: Path | None, timeout: float = 120.0, config: Path | None = None) -> dict[str, float]:
    """One run (with ``config``, else the default config): seconds for 'start', 'to_eof', 'to_exit'; 'code' the
    agent's exit code."""
    with tempfile.TemporaryDirectory(prefix="oe-startup-") as tmp:
        env = {**os.environ, "OE_BENCH_DIR": tmp}
        if tree is not None:
            env["PYTHONPATH"] = os.pathsep.join(x for x in (str(tree), env.get("PYTHONPATH", "")) if x)
        conf = ["--config", str(config)] if config is not None else []
        argv = [sys.executable, "-m", "otel_ebpf", "run", *conf, "--output", f"{tmp}/out", "--", *COMMAND]
        eof: list[int] = []
        t0 = time.time_ns()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp, env=env)
        assert proc.stdout is not None
        out = proc.stdout

        def read_to_eof() -> None:
            while out.read(65536):
                pass
            eof.append(time.time_ns())

        reader = threading.Thread(target=read_to_eof, daemon=True)
        reader.start()
        code = proc.wait(timeout)
        exited = time.time_ns()
        reader.join(timeout)
        if not eof:
            raise RuntimeError(f"the pipe did not reach EOF within {timeout} s of the agent's exit")
        start, end = (int(Path(tmp, n).read_text()) for n in ("start", "end"))
        return {"start": (start - t0) / 1e9, "to_eof": (eof[0] - end) / 1e9, "to_exit": (exited - end) / 1e9,
                "code": float(code)}


def compile_once(receiver: str) -> dict[str, float]:
    """In this interpreter: 'wall' and 'cpu' seconds of compiling and loading ``receiver``'s program."""
    from otel_ebpf.bpf.clock import KernelClock
    from otel_ebpf.bpf.loader import import_bcc
    from otel_ebpf.core.pipeline import Context, ListConsumer
    from otel_ebpf.service import components

    factory = components.receivers()[receiver]
    ctx = Context(target_pids=[os.getpid()], clock=KernelClock())
    r = factory.create(factory.config_class(), ctx, ListConsumer())
    source, cflags = r.source(), r.program_cflags()
    bcc = import_bcc()
    t0, c0 = time.monotonic(), time.process_time()
    bpf = bcc.BPF(text=source, cflags=cflags)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    verified = sum(_verified_insns(fn.fd) for fn in bpf.funcs.values())
    bpf.cleanup()
    return {"wall": wall, "cpu": cpu, "verified_insns": float(verified)}


def _verified_insns(prog_fd: int) -> int:
    """Instructions the verifier walked for a loaded program (/proc/self/fdinfo, kernel 5.16+; 0 unknown)."""
    try:
        with open(f"/proc/self/fdinfo/{prog_fd}") as fh:
            for line in fh:
                if line.startswith("verified_insns:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _compile_in(tree: Path | None, receiver: str) -> dict[str, float]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(tree), env.get("PYTHONPATH", "")) if x)
    with tempfile.TemporaryDirectory(prefix="oe-compile-") as tmp:
        out = subprocess.run([sys.executable, __file__, "--compile-one", receiver], cwd=tmp, env=env,
                             capture_output=True, text=True, timeout=300, check=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _compile_rounds(trees: list[tuple[str, Path | None]], receivers: list[str], rounds: int) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, float]]]] = {name: {r: [] for r in receivers} for name, _ in trees}
    for i in range(rounds):
        for name, path in trees:
            for rec in receivers:
                m = _compile_in(path, rec)
                runs[name][rec].append(m)
                print(f"round {i + 1} {name} {rec}: cpu {m['cpu']:.2f} s, wall {m['wall']:.2f} s, "
                      f"verifier {int(m['verified_insns']):,} insns", flush=True)
    for rec in receivers:
        for name, _ in trees:
            ms = runs[name][rec]
            print(f"{rec} {name}: cpu {_summary([m['cpu'] for m in ms])}; wall {_summary([m['wall'] for m in ms])}; "
                  f"verifier {int(statistics.median(m['verified_insns'] for m in ms)):,} insns")
    return runs


def _tree(spec: str) -> tuple[str, Path | None]:
    name, _, path = spec.partition("=")
    return name, (Path(path).resolve() if path else None)


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="an otel_ebpf source tree to measure (repeatable); default: the installed package")
    ap.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    ap.add_argument("--config", type=Path, help="run with this config (e.g. python, torch and sched in the "
                                                "pipeline) instead of the default one")
    ap.add_argument("--compile", metavar="R1,R2", help="per receiver: its program's compile and load time")
    ap.add_argument("--compile-one", metavar="RECEIVER", help=argparse.SUPPRESS)  # one measurement, JSON
    args = ap.parse_args(argv)
    if args.compile_one:
        print(json.dumps(compile_once(args.compile_one)))
        return 0
    trees = [_tree(t) for t in args.tree] or [("current", None)]
    if args.compile:
        result = _compile_rounds(trees, args.compile.split(","), args.rounds)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for i in range(args.rounds):
        for name, path in trees:
            r = measure_once(path, config=args.config.resolve() if args.config else None)
            runs[name].append(r)
            print(f"round {i + 1} {name}: start {r['start']:.2f} s, command exit -> EOF {r['to_eof']:.2f} s, "
                  f"-> agent exit {r['to_exit']:.2f} s (exit {int(r['code'])})", flush=True)
    for name, rs in runs.items():
        print(f"{name}: start {_summary([r['start'] for r in rs])}; exit -> EOF "
              f"{_summary([r['to_eof'] for r in rs])}; exit -> agent exit {_summary([r['to_exit'] for r in rs])}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
