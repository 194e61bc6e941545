"""``otel-ebpf run``: trace a command (``-- CMD``), running processes (``--pid``) or every process
(``--all-processes``), then print the end-of-run summary.

The parser lives in :mod:`otel_ebpf.cli`; :func:`run` takes its parsed arguments and returns the exit
code: the command's own for ``-- CMD`` (0 for ``--pid``/``--all-processes``), or
:data:`EXIT_EXPORT_LOST` when an exporter delivered nothing and lost something; 127 (126) as a shell, before
anything is loaded, when the command is not found (is not executable). Errors are raised as
:class:`otel_ebpf.core.errors.OtelEbpfError` subclasses; the CLI turns them into exit codes.

Blocking: :func:`run` returns when the command has exited (or SIGINT/SIGTERM for ``--pid`` and
``--all-processes``) and the agent has flushed. It installs signal handlers: main thread only.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from otel_ebpf.core import gctune
from otel_ebpf.core.errors import TargetError

__all__ = ["EXIT_EXPORT_LOST", "EXIT_NOT_EXECUTABLE", "EXIT_NOT_FOUND", "run", "unrunnable"]

log = logging.getLogger("otel_ebpf")
EXIT_EXPORT_LOST = 4  # run: an exporter delivered nothing and lost something (the summary names it)


EXIT_NOT_FOUND, EXIT_NOT_EXECUTABLE = 127, 126  # as a shell reports a command it cannot run (POSIX 2.8.2)


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def unrunnable(argv0: str, path_env: str | None) -> tuple[int, str] | None:
    """Why ``execvp(argv0)`` would fail, found the way it searches: (exit code, message), or None when it would
    run. A name with a '/' is that file; else the first executable file of that name in ``path_env``'s
    directories (``os.defpath`` when unset; an empty entry is the current directory). 127: no such file (or
    none in PATH); 126: found, but not an executable file (a directory, or no execute permission)."""
    if not argv0:
        return EXIT_NOT_FOUND, "cannot run '': empty command name"
    if "/" in argv0:
        if not os.path.exists(argv0):
            return EXIT_NOT_FOUND, f"cannot run {argv0!r}: no such file"
        if not _executable(argv0):
            what = "is a directory" if os.path.isdir(argv0) else "permission denied (not an executable file)"
            return EXIT_NOT_EXECUTABLE, f"cannot run {argv0!r}: {what}"
        return None
    dirs = (os.defpath if path_env is None else path_env).split(os.pathsep)
    candidates = [os.path.join(d or ".", argv0) for d in dirs]
    if any(_executable(c) for c in candidates):
        return None
    denied = next((c for c in candidates if os.path.exists(c)), None)
    if denied is not None:
        return EXIT_NOT_EXECUTABLE, f"cannot run {argv0!r}: {denied} is not an executable file"
    return EXIT_NOT_FOUND, f"cannot run {argv0!r}: command not found in PATH"


def _load_cfg(args: argparse.Namespace) -> Any:
    from otel_ebpf.service import settings
    extra: dict[str, Any] = {}
    if args.service_name:
        extra.setdefault("service", {})["service_name"] = args.service_name
    if args.strict:
        extra.setdefault("service", {})["strict"] = True
    return settings.load(args.config, output=args.output, endpoint=args.otlp_endpoint,
                         protocol=args.otlp_protocol, extra=extra)


def _check_pids(pids: Sequence[int]) -> None:
    for pid in pids:
        if pid <= 0 or not os.path.exists(f"/proc/{pid}"):
            raise TargetError(f"no process with PID {pid}")


def _with_descendants(pids: Sequence[int]) -> list[int]:
    """``pids`` and the processes they made before the agent attached (torchrun's workers for ``--pid`` of
    torchrun): the kernel follows forks from the attach on, not those made before it."""
    from otel_ebpf.service.deferred import descendants

    made = descendants(pids)
    if made:
        print(f"otel-ebpf: also tracing {len(made)} process(es) that --pid {', '.join(map(str, pids))} started "
              f"before the attach: {', '.join(map(str, made[:8]))}{' ...' if len(made) > 8 else ''}",
              file=sys.stderr, flush=True)
    return [*pids, *made]


_UNITS = {"spans": ("span", "spans"), "logs": ("log record", "log records"),
          "metrics": ("metric collection", "metric collections")}


def _items(n: int, signal: str) -> str:
    one, many = _UNITS.get(signal, ("item", "items"))
    return f"{n} {one if n == 1 else many}"


def delivery_line(eid: str, where: str, signals: dict[str, tuple[int, dict[str, int]]]) -> tuple[str, bool]:
    """One exporter's summary line and whether it lost everything (nothing delivered, something lost)."""
    sent = ", ".join(_items(n, sig) for sig, (n, _) in sorted(signals.items()) if n) or "nothing"
    lost = [f"{_items(sum(r.values()), sig)} ({', '.join(f'{k} {v}' for k, v in sorted(r.items()))})"
            for sig, (_, r) in sorted(signals.items()) if sum(r.values())]
    everything = bool(lost) and not any(n for n, _ in signals.values())
    if everything:
        return f"exporter {eid} -> {where}: NOTHING DELIVERED, lost {', '.join(lost)}", True
    return f"exporter {eid} -> {where}: sent {sent}" + (f"; LOST {', '.join(lost)}" if lost else ""), False


def _report(agent: Any, started: float, command_code: int | None) -> bool:
    """Print the end-of-run summary: the counts, the command's exit code, then per exporter what was sent
    and what was lost by signal and reason. True when an exporter lost everything."""
    s = agent.summary()
    drops, limited = agent.drops(), agent.drops(lost=False)  # lost vs not recorded by a limit (NOT_LOST_REASONS)
    where = f" ({', '.join(f'{k}={v}' for k, v in sorted(drops.items()))})" if drops else ""
    unrecorded = (f", {sum(limited.values())} not recorded by a limit, not lost "
                  f"({', '.join(f'{k}={v}' for k, v in sorted(limited.items()))})") if limited else ""
    logs = f"{s['logs']} log records, " if s.get("logs") else ""
    exited = f"; the command exited {command_code}" if command_code is not None else ""
    print(f"otel-ebpf: {s['events']} events, {s['spans']} spans, {logs}{s['dropped']} dropped{where}{unrecorded}, "
          f"{s['probes']} probes attached ({s['probe_failures']} failed) in {time.monotonic() - started:.1f}s"
          f"{exited}", file=sys.stderr)
    from otel_ebpf.bpf.gate import GATE_LATE

    late = sum(n for name, _, n in agent.ctx.telemetry.snapshot() if name == GATE_LATE)
    for rid, why in sorted(agent.failed_receivers().items()):
        print(f"otel-ebpf: receiver {rid} failed to start in the background (its data is missing): {why}",
              file=sys.stderr)
    if late:
        print(f"otel-ebpf: {late} library loads went on before their receiver was ready (their first calls "
              "are missing; service.pause_timeout)", file=sys.stderr)
    failed = []
    for eid, signals in sorted(agent.deliveries().items()):
        c = agent.cfg.exporters[eid]
        where = str(getattr(c, "directory", None) or getattr(c, "endpoint", ""))
        line, everything = delivery_line(eid, where, signals)
        print(f"otel-ebpf: {line}", file=sys.stderr)
        if everything:
            failed.append(eid)
    if failed:
        own = f" (the command's own exit code: {command_code})" if command_code is not None else ""
        print(f"otel-ebpf: exit {EXIT_EXPORT_LOST}: exporter {', '.join(failed)} delivered nothing{own}",
              file=sys.stderr)
    return bool(failed)


def run(args: argparse.Namespace) -> int:
    """``otel-ebpf run`` with the parsed ``args`` (otel_ebpf.cli's run parser); the exit code."""
    from otel_ebpf.service.agent import Agent, PausedChild, command_environment, wait_child, wait_pids

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    modes = sum(bool(x) for x in (command, args.pid, args.all_processes))
    if modes != 1 and not args.dump_bpf:
        raise TargetError("give exactly one of: -- COMMAND, --pid PID, --all-processes")
    why = unrunnable(command[0], os.environ.get("PATH")) if command and not args.dump_bpf else None
    if why is not None:  # said at once, before a probe is compiled (issue 18: it took 8 s)
        print(f"otel-ebpf: {why[1]}", file=sys.stderr)
        return why[0]
    cfg = _load_cfg(args)
    _check_pids(args.pid)
    gctune.tune()
    if args.dump_bpf:
        print(Agent(cfg, target_pids=args.pid or [1], command=command).dump_programs())
        return 0
    env, env_line = command_environment(cfg, os.environ) if command else ({}, "")
    if env_line:
        print(f"otel-ebpf: {env_line}", file=sys.stderr, flush=True)
    child = PausedChild(command, env) if command else None
    targets = [child.pid] if child else _with_descendants(args.pid)
    started = time.monotonic()
    # --pid/--all-processes: SIGINT/SIGTERM are ours from here, so one that comes while the probes attach (or
    # just after "tracing started") detaches cleanly once the start is done instead of a KeyboardInterrupt
    # traceback (CI, stop 32: SIGINT landed between that line and the handler's install)
    stop = None if child else _StopOnSignal()
    deferred = bool(child) and cfg.service.deferred_start and not cfg.service.strict
    if deferred:  # a background compile redirects fd 2 (the loader's capture): our lines go to a copy of it
        sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)
    try:
        agent = Agent(cfg, target_pids=targets, command=command, defer_stages=deferred)
        agent.start(deferred=deferred)
    except BaseException:
        if child:
            child.abort()
        raise
    gctune.freeze_startup()
    late = agent.loading()
    log.info("tracing started in %.2fs%s", time.monotonic() - started,
             f"; loading in the background: {', '.join(late)}" if late else "")
    from otel_ebpf.service.progress import Progress

    progress = Progress(agent.summary, sys.stderr)
    if not args.quiet:
        progress.start()
    code, ended = 0, "interrupted"
    try:
        if child:
            child.release()
            code = wait_child(child.pid, lambda s: log.info("signal %d: forwarding", s))
            ended = f"{_shown(command)} exited ({code})"
        else:
            assert stop is not None
            ended = _wait_targets(targets, wait_pids, stop)
    finally:
        progress.stop()
        print(f"otel-ebpf: {ended}; flushing what was collected...", file=sys.stderr, flush=True)
        agent.shutdown(exiting=True)
        lost_everything = _report(agent, started, code if child else None)
    return EXIT_EXPORT_LOST if lost_everything else code


def _shown(command: Sequence[str], width: int = 60) -> str:
    """The command as the exit line names it, cut to ``width`` characters."""
    text = shlex.join(command)
    return text if len(text) <= width else text[:width - 3] + "..."


class _StopOnSignal:
    """SIGINT/SIGTERM set an event, from construction on; the first signal's name is kept. One that comes before
    the wait (the probes still attaching) says it is held till then; a second one there stops the start at once
    (KeyboardInterrupt), so a start that takes long can still be left."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.got: list[int] = []
        self.waiting = False
        # the terminal as it is now: the handler may run inside the loader's capture of fd 2 (a compile's output)
        self._say_fd = os.dup(sys.stderr.fileno())
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, self._on_signal)

    def wait(self) -> None:
        """From now on a signal only ends the wait."""
        self.waiting = True
        os.close(self._say_fd)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.got.append(signum)
        self.event.set()
        if not self.waiting and len(self.got) == 1:
            os.write(self._say_fd, f"otel-ebpf: {signal.Signals(signum).name} received: detaching once the start is "
                                   "done (again to stop now)\n".encode())
        elif not self.waiting:
            raise KeyboardInterrupt


def _wait_targets(targets: Sequence[int], wait_pids: Any, stop: _StopOnSignal) -> str:
    """Until SIGINT/SIGTERM, or every process of ``--pid`` has exited; what ended it, for the exit line."""
    stop.wait()
    if targets:
        wait_pids(targets, stop.event)
    else:  # bounded waits: the handler runs on the main thread, even when another thread took the signal
        while not stop.event.wait(0.5):
            pass
    if stop.got:
        return f"{signal.Signals(stop.got[0]).name} received, detaching"
    return f"{'pid' if len(targets) == 1 else 'pids'} {', '.join(map(str, targets))} exited"
