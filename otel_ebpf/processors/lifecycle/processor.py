"""Lifecycle events (otel_ebpf/receivers/lifecycle) -> SpanRecord; everything else passes unchanged.

Spans (``process_spans``, scope ``otel_ebpf.lifecycle``): one ``process <name>`` span per traced
process, from its fork (or its first exec, when the fork was not seen) to its exit, with
``process.pid``, ``process.parent_pid``, ``process.command_args`` / ``process.command_line`` /
``process.executable.path`` / ``process.executable.name`` (its last exec, read in the kernel; a
child that never exec'd inherits its parent's), ``process.args_count``, ``process.exit.code``
(exit_group's code; absent when killed by a signal; not 0: status ERROR),
``process.lifecycle.args.truncated``, ``process.lifecycle.execs.dropped``, and one
``process.exec`` event per exec. Processes still running at shutdown end there, with
``process.lifecycle.running = true``.

Secrets: argv comes from the traced process's memory, so it goes through the same redaction as
the resource's ``process.command_line`` (:func:`otel_ebpf.host.redact.redact_command_line`,
after control characters are stripped, :func:`otel_ebpf.host.attributes.clean`) before it is put
on a span or an event: redacted once, at exec, so nothing unredacted is ever kept. An argument
holding several words (``sh -c "tool --token x"``) is redacted word by word as well.

Threading: single-threaded (the pipeline worker); ``consume`` never raises.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.semconv._incubating.attributes import process_attributes as pa

from otel_ebpf.core.events import ProcessExit, SpanEventRecord, SpanRecord
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.core.processing import EventProcessor, handles
from otel_ebpf.host.attributes import MAX_VALUE_CHARS, clean
from otel_ebpf.host.redact import redact_command_line

from ...receivers.lifecycle.events import LifecycleExec, LifecycleExitCode, LifecycleFork
from .config import Config

__all__ = ["SCOPE", "LifecycleProcessor", "redact_argv"]

SCOPE = "otel_ebpf.lifecycle"
TELEMETRY_NAME = "lifecycle"
_ARG_READ = 4096  # longer than any argument the kernel side keeps (LC_ARG_MAX): clean() must not cut a key


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """``argv`` as it may be exported: control characters stripped, secret values replaced by
    ``<redacted>`` (keys kept), as the resource's command line is; an argument with spaces (a
    ``sh -c`` script) also word by word; each argument cut to 256 characters. Never raises for str."""
    return tuple(a[:MAX_VALUE_CHARS] for a in redact_command_line([clean(a, _ARG_READ) for a in argv]))


@dataclass(slots=True)
class _Life:
    start_ns: int
    ppid: int | None = None
    comm: str = ""
    filename: str = ""
    argv: tuple[str, ...] = ()  # redacted
    truncated: bool = False
    execs: list[SpanEventRecord] = field(default_factory=list)
    execs_dropped: int = 0
    exit_code: int | None = None


class LifecycleProcessor(EventProcessor[Config]):
    """Processor ``lifecycle``. Owns the table of live processes (bounded)."""

    NAME = TELEMETRY_NAME
    SCOPE = SCOPE

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(config, ctx, next_)
        self._procs: OrderedDict[int, _Life] = OrderedDict()

    def shutdown(self) -> None:
        """Ends the spans of processes still running (safe twice: the table is emptied)."""
        out: list[object] = []
        now = time.time_ns()
        while self._procs:
            pid, life = self._procs.popitem(last=False)
            if self.config.process_spans:
                out.append(self._span(pid, life, max(now, life.start_ns), running=True))
        if out:
            self._next.consume(out)

    @property
    def live_processes(self) -> int:
        return len(self._procs)

    def _life(self, pid: int, start_ns: int) -> _Life:
        life = self._procs.get(pid)
        if life is None:
            while len(self._procs) >= self.config.max_processes:
                self._procs.popitem(last=False)
                self._telemetry.dropped(TELEMETRY_NAME, "process_table_full")
            life = self._procs[pid] = _Life(start_ns)
        return life

    @handles(LifecycleFork)
    def _fork(self, ev: LifecycleFork, out: list[object]) -> None:
        self._procs.pop(ev.pid, None)  # a pid reused: the old process's exit was missed
        life = self._life(ev.pid, ev.time_ns)
        life.ppid, life.comm = ev.ppid, clean(ev.comm)
        parent = self._procs.get(ev.ppid)
        if parent is not None:  # until it execs, the child runs its parent's program
            life.filename, life.argv, life.truncated = parent.filename, parent.argv, parent.truncated

    @handles(LifecycleExec)
    def _exec(self, ev: LifecycleExec, out: list[object]) -> None:
        life = self._life(ev.pid, ev.time_ns)
        filename = clean(ev.filename)
        life.filename, life.argv, life.truncated = filename, redact_argv(ev.argv), ev.truncated
        life.comm = os.path.basename(filename)[:15]
        if len(life.execs) >= self.config.max_execs:
            life.execs_dropped += 1
            return
        life.execs.append(SpanEventRecord("process.exec", ev.time_ns, {
            pa.PROCESS_EXECUTABLE_PATH: filename, pa.PROCESS_COMMAND_ARGS: life.argv, "thread.id": ev.tid}))

    @handles(LifecycleExitCode)
    def _exit_code(self, ev: LifecycleExitCode, out: list[object]) -> None:
        life = self._procs.get(ev.pid)
        if life is not None:
            life.exit_code = ev.exit_code

    @handles(ProcessExit)
    def _exit(self, ev: ProcessExit, out: list[object]) -> None:
        try:
            if ev.source not in ("", TELEMETRY_NAME):
                return
            life = self._procs.pop(ev.pid, None)
            if life is None:
                life = _Life(ev.time_ns, comm=clean(ev.comm))  # exit of a process seen only now
            if not life.comm:
                life.comm = clean(ev.comm)
            if self.config.process_spans:
                out.append(self._span(ev.pid, life, ev.time_ns, running=False))
        finally:
            out.append(ev)

    def _span(self, pid: int, life: _Life, end_ns: int, *, running: bool) -> SpanRecord:
        attrs: dict[str, Any] = {pa.PROCESS_PID: pid}
        if life.ppid is not None:
            attrs[pa.PROCESS_PARENT_PID] = life.ppid
        if life.argv:
            attrs[pa.PROCESS_COMMAND_ARGS] = life.argv
            attrs[pa.PROCESS_COMMAND_LINE] = " ".join(life.argv)
            attrs[pa.PROCESS_ARGS_COUNT] = len(life.argv)
        if life.filename:
            attrs[pa.PROCESS_EXECUTABLE_PATH] = life.filename
            attrs[pa.PROCESS_EXECUTABLE_NAME] = os.path.basename(life.filename)
        if life.truncated:
            attrs["process.lifecycle.args.truncated"] = True
        if life.execs_dropped:
            attrs["process.lifecycle.execs.dropped"] = life.execs_dropped
        if life.exit_code is not None:
            attrs[pa.PROCESS_EXIT_CODE] = life.exit_code
        if running:
            attrs["process.lifecycle.running"] = True
        name = os.path.basename(life.filename) if life.filename else life.comm
        error = f"exit code {life.exit_code}" if life.exit_code else None
        return SpanRecord(pid, f"process {name}".rstrip(), life.start_ns, max(end_ns, life.start_ns), attrs,
                          scope=SCOPE, error=error, events=tuple(life.execs), comm=life.comm or None)
