"""Sched events (otel_ebpf/receivers/sched) -> MetricRecord / SpanRecord; everything else passes unchanged.

Metrics (scope ``otel_ebpf.sched``, per process resource; semconv names where they exist):

* ``process.cpu.time`` counter s: on-CPU time (no ``cpu.mode``: the scheduler does not split
  user from system time).
* ``process.sched.cpu.time`` counter s, by ``cpu.logical_number``: on-CPU time per core.
* ``process.sched.off_cpu.time`` counter s, by ``process.sched.off_cpu.reason`` (``sleep``,
  ``io``, ``lock``, ``other``): time blocked, from switch-out to wakeup.
* ``process.sched.runq.time`` counter s: time runnable but waiting for a CPU.
* ``process.sched.runq.latency`` histogram s: each wait in the run queue (in-kernel log2
  buckets; each is reported at 1.5 x its lower bound, so values are within x1.5).
* ``process.context_switches`` counter {context_switch}, by ``process.context_switch.type``
  (``voluntary``: the thread blocked; ``involuntary``: preempted or yielded while runnable).

Spans (``process.spans``): one ``process <name>`` span per traced process, from its fork (or
its first exec, when the fork was not seen) to its exit, with ``process.pid``,
``process.parent_pid``, ``process.command_args`` / ``process.command_line`` /
``process.executable.path`` / ``process.executable.name`` (its last exec, read in the kernel;
a child that never exec'd inherits its parent's), ``process.args_count``,
``process.exit.code`` (exit_group's code; absent when killed by a signal; not 0: status ERROR),
``process.sched.args.truncated``, ``process.sched.execs.dropped``, and one ``process.exec``
event per exec. Processes still running at shutdown end there, with
``process.sched.running = true``.

Threading: single-threaded (the pipeline worker); ``consume`` never raises.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.semconv._incubating.attributes import cpu_attributes as cpu
from opentelemetry.semconv._incubating.attributes import process_attributes as pa
from opentelemetry.semconv._incubating.metrics import process_metrics as pm

from otel_ebpf.core.events import ProcessExit, SpanEventRecord, SpanRecord
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles

from ...receivers.sched.events import (
    OFF_CPU_REASONS,
    SchedCpuStats,
    SchedExec,
    SchedExitCode,
    SchedFork,
    SchedProcStats,
)
from .config import Config

__all__ = ["METRICS", "SCOPE", "SchedProcessor", "bucket_value"]

SCOPE = "otel_ebpf.sched"
TELEMETRY_NAME = "sched"
REASON = "process.sched.off_cpu.reason"
# name -> (kind, unit, description)
METRICS: dict[str, MetricSpec] = {
    pm.PROCESS_CPU_TIME: ("counter", "s", "On-CPU time of the process's threads."),
    "process.sched.cpu.time": ("counter", "s", "On-CPU time per logical CPU core."),
    "process.sched.off_cpu.time": ("counter", "s", "Time threads were blocked (switch-out to wakeup), by reason."),
    "process.sched.runq.time": ("counter", "s", "Time threads were runnable but waiting for a CPU."),
    "process.sched.runq.latency": ("histogram", "s", "Run-queue waits (wakeup or preemption to switch-in)."),
    pm.PROCESS_CONTEXT_SWITCHES: ("counter", "{context_switch}", "Context switches, by type."),
}


def bucket_value(slot: int) -> float:
    """Seconds reported for log2 bucket ``slot`` ([2^slot, 2^(slot+1)) ns)."""
    return (1.5 * (1 << slot)) / 1e9


@dataclass(slots=True)
class _Life:
    start_ns: int
    ppid: int | None = None
    comm: str = ""
    filename: str = ""
    argv: tuple[str, ...] = ()
    truncated: bool = False
    execs: list[SpanEventRecord] = field(default_factory=list)
    execs_dropped: int = 0
    exit_code: int | None = None


class SchedProcessor(EventProcessor[Config]):
    """Processor ``sched``. Owns the table of live processes (bounded)."""

    NAME = TELEMETRY_NAME
    SCOPE = SCOPE
    METRICS = METRICS

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

    # ---- metrics ---------------------------------------------------------------------
    @handles(SchedProcStats)
    def _proc_stats(self, ev: SchedProcStats, out: list[object]) -> None:
        pid = ev.pid
        if ev.on_cpu_ns:
            self.metric(out, pid, pm.PROCESS_CPU_TIME, ev.on_cpu_ns / 1e9, {})
        for reason, ns in zip(OFF_CPU_REASONS, ev.off_cpu_ns, strict=True):
            if ns:
                self.metric(out, pid, "process.sched.off_cpu.time", ns / 1e9, {REASON: reason})
        if ev.runq_ns:
            self.metric(out, pid, "process.sched.runq.time", ev.runq_ns / 1e9, {})
        for kind, n in (("voluntary", ev.voluntary), ("involuntary", ev.involuntary)):
            if n:
                self.metric(out, pid, pm.PROCESS_CONTEXT_SWITCHES, n, {pa.PROCESS_CONTEXT_SWITCH_TYPE: kind})
        for slot, n in ev.runq_hist:
            self.metric(out, pid, "process.sched.runq.latency", bucket_value(slot), {}, count=n)

    @handles(SchedCpuStats)
    def _cpu_stats(self, ev: SchedCpuStats, out: list[object]) -> None:
        if ev.on_cpu_ns:
            self.metric(out, ev.pid, "process.sched.cpu.time", ev.on_cpu_ns / 1e9, {cpu.CPU_LOGICAL_NUMBER: ev.cpu})

    # ---- lifecycle -------------------------------------------------------------------
    def _life(self, pid: int, start_ns: int) -> _Life:
        life = self._procs.get(pid)
        if life is None:
            while len(self._procs) >= self.config.max_processes:
                self._procs.popitem(last=False)
                self._telemetry.dropped(TELEMETRY_NAME, "process_table_full")
            life = self._procs[pid] = _Life(start_ns)
        return life

    @handles(SchedFork)
    def _fork(self, ev: SchedFork, out: list[object]) -> None:
        self._procs.pop(ev.pid, None)  # a pid reused: the old process's exit was missed
        life = self._life(ev.pid, ev.time_ns)
        life.ppid, life.comm = ev.ppid, ev.comm
        parent = self._procs.get(ev.ppid)
        if parent is not None:  # until it execs, the child runs its parent's program
            life.filename, life.argv, life.truncated = parent.filename, parent.argv, parent.truncated

    @handles(SchedExec)
    def _exec(self, ev: SchedExec, out: list[object]) -> None:
        life = self._life(ev.pid, ev.time_ns)
        life.filename, life.argv, life.truncated = ev.filename, ev.argv, ev.truncated
        life.comm = os.path.basename(ev.filename)[:15]
        if len(life.execs) >= self.config.max_execs:
            life.execs_dropped += 1
            return
        life.execs.append(SpanEventRecord("process.exec", ev.time_ns, {
            pa.PROCESS_EXECUTABLE_PATH: ev.filename, pa.PROCESS_COMMAND_ARGS: ev.argv,
            "thread.id": ev.tid}))

    @handles(SchedExitCode)
    def _exit_code(self, ev: SchedExitCode, out: list[object]) -> None:
        life = self._procs.get(ev.pid)
        if life is not None:
            life.exit_code = ev.exit_code

    @handles(ProcessExit)
    def _exit(self, ev: ProcessExit, out: list[object]) -> None:
        try:
            if ev.source not in ("", "sched"):
                return
            life = self._procs.pop(ev.pid, None)
            if life is None:
                life = _Life(ev.time_ns, comm=ev.comm)  # exit of a process seen only now
            if not life.comm:
                life.comm = ev.comm
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
            attrs["process.sched.args.truncated"] = True
        if life.execs_dropped:
            attrs["process.sched.execs.dropped"] = life.execs_dropped
        if life.exit_code is not None:
            attrs[pa.PROCESS_EXIT_CODE] = life.exit_code
        if running:
            attrs["process.sched.running"] = True
        name = os.path.basename(life.filename) if life.filename else life.comm
        error = f"exit code {life.exit_code}" if life.exit_code else None
        return SpanRecord(pid, f"process {name}".rstrip(), life.start_ns, max(end_ns, life.start_ns), attrs,
                          scope=SCOPE, error=error, events=tuple(life.execs), comm=life.comm or None)
