"""The sched receiver: scheduler tracepoints (sched.bpf.c) -> typed events (events.py).

Fork, exec and exit code are the lifecycle receiver's (otel_ebpf/receivers/lifecycle); this
program puts no records in its ring buffer (the base still reports each exit as a
:class:`~otel_ebpf.core.events.ProcessExit`, ``source="sched"``). Scheduler figures are
accounted in the kernel and read here: every ``stats_interval`` the
per-process counters become :class:`SchedProcStats` / :class:`SchedCpuStats` deltas (counters
of processes that are gone are read a last time and deleted); every ``sample_interval`` the
threads watched in ``ctx.host_stats`` are sampled (cumulative, including the slice in
progress, and which counter is growing then) for the per-step figures of the NCCL processor.

Threading: everything here runs on the receiver's own poll thread (``poll_maps``
and the samples it pushes into ``ctx.host_stats``); the pipeline thread only reads what was
pushed. Nothing here raises into the poll loop.
"""
from __future__ import annotations

import ctypes as ct
import logging
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from otel_ebpf.bpf.newtask import attach_newtask, compile_offsets, newtask_offsets
from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.host.procfs import process_gone

from .config import Config
from .events import OFF_CPU_REASONS, SchedCpuStats, SchedProcStats

__all__ = ["SchedReceiver"]

log = logging.getLogger(__name__)
_HIST_SLOTS = 40  # SCHED_HIST_SLOTS
_R_RUNQ = 4  # SCHED_R_RUNQ
_RINGBUF_PAGES = 8  # the base's "events" buffer, which this program never writes
SWITCHES_MISSED = "otel_ebpf.sched.switches_missed"  # {receiver}: runs of a thread not counted on-CPU


ProcTotals = tuple[int, ...]  # on, off x4, runq, voluntary, involuntary, hist x40


class SchedReceiver(BpfReceiver):
    """Receiver ``sched``: scheduler figures of the processes in
    ``ctx.target_pids`` and their descendants (every process when there are none)."""

    name = "sched"
    src_file = Path(__file__).with_name("sched.bpf.c")

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(ctx, next_, ringbuf_pages=_RINGBUF_PAGES, poll_interval=config.sample_interval)
        self.config = config
        self._totals: dict[int, ProcTotals] = {}
        self._cpu_totals: dict[tuple[int, int], int] = {}
        self._next_stats = 0.0
        self._next_sample = 0.0
        self._final_read = False
        self._missed_seen = [0]
        self._offsets: tuple[int, int] | None = None
        self._on_demand = threading.Lock()  # an asking thread's read vs shutdown's cleanup
        self._on_demand_open = False

    def cflags(self) -> list[str]:
        return self._flags(compile_offsets(self._offsets))

    def _flags(self, offsets: tuple[int, int]) -> list[str]:
        c = self.config
        return [f"-DSCHED_MAX_THREADS={c.max_threads}", f"-DSCHED_MAX_PROCS={c.max_processes}",
                f"-DSCHED_MAX_CPU_KEYS={c.max_cpu_keys}", f"-DSCHED_LOCK={1 if c.lock_reason else 0}",
                f"-DSCHED_NEWTASK_PID_OFF={offsets[0]}", f"-DSCHED_NEWTASK_FLAGS_OFF={offsets[1]}"]

    def start(self) -> None:
        if self.bpf is not None:
            return
        self._offsets = newtask_offsets()
        super().start()
        attach_newtask(self, "sched_newtask", lost="a new thread's first run-queue wait is not counted")
        if self.ctx.host_stats is not None:
            self._on_demand_open = True
            self.ctx.host_stats.set_sampler(self._sample_on_demand)

    # ---- in-kernel counters -----------------------------------------------------------
    def poll_maps(self) -> list[object]:
        now = time.monotonic()
        out: list[object] = []
        try:
            if now >= self._next_sample:
                self._next_sample = now + self.config.sample_interval
                self.sample_watched()
            if self._final_read or now >= self._next_stats:
                self._next_stats = now + self.config.stats_interval
                out.extend(self.read_stats())
                self._read_missed()
        except Exception:  # a map read must not stop the poll loop
            log.debug("%s: reading maps failed", self.name, exc_info=True)
            self.ctx.telemetry.dropped(self.name, "map_read_error")
        return out

    def sample_watched(self) -> None:
        """Push a sample of every thread watched in ``ctx.host_stats`` (poll thread)."""
        stats = self.ctx.host_stats
        if stats is None:
            return
        for pid, tid in stats.watched():
            if tid:
                self.sample_thread(pid, tid)

    def sample_thread(self, pid: int, tid: int) -> None:
        """Add thread ``tid``'s cumulative figures now (with the on/off-CPU slice in progress)
        to ``ctx.host_stats``, with the counter growing then (``growing``). Nothing when it is not
        (or no longer) a thread of ``pid``. The poll thread, or an asking thread through
        :meth:`_sample_on_demand` (a map lookup is one bpf() call: thread-safe)."""
        bpf, stats = self.bpf, self.ctx.host_stats
        if bpf is None or stats is None or not tid:
            return
        try:
            t = bpf["threads"][ct.c_uint32(tid)]
        except KeyError:
            return
        now = time.monotonic_ns()  # CLOCK_MONOTONIC, as bpf_ktime_get_ns()
        if t.tgid != pid:
            return
        on, off, runq = t.on_ns, list(t.off_ns), t.runq_ns
        growing = ""
        if t.on_ts and now > t.on_ts:
            on += now - t.on_ts
            growing = "on_cpu_ns"
        elif t.off_ts and now > t.off_ts:
            woken = t.off_ts <= t.wake_ts <= now
            wake = t.wake_ts if woken else now
            if t.reason < len(off):
                off[t.reason] += wake - t.off_ts
                growing = f"off_cpu_{OFF_CPU_REASONS[t.reason]}_ns"
            if t.wake_ts or t.reason == _R_RUNQ:
                runq += now - wake
            if woken:  # preempted threads are woken at once (sched.bpf.c)
                growing = "runq_ns"
        counters = {f"off_cpu_{r}_ns": off[i] for i, r in enumerate(OFF_CPU_REASONS)}
        stats.add(pid, self.clock.to_epoch_ns(now), tid=tid, growing=growing, on_cpu_ns=on, runq_ns=runq,
                  **counters)

    def _read_missed(self) -> None:
        """Switch-ins the program did not see since the last read (sched.bpf.c ``switch_missed``), into
        ``otel_ebpf.sched.switches_missed{receiver}``: each is a run of a thread not counted on-CPU."""
        for _name, grown in self._array_deltas("switch_missed", ("missed",), self._missed_seen):
            self.ctx.telemetry.add(SWITCHES_MISSED, grown, receiver=self.name)

    def read_stats(self) -> list[object]:
        """Deltas of every process's counters since the last read; processes that are gone
        are read a last time and their counters deleted."""
        bpf = self.bpf
        if bpf is None:
            return []
        now_ns = time.time_ns()
        out: list[object] = []
        gone: set[int] = set()
        procs = bpf["procs"]
        for key, v in procs.items():
            pid = key.value
            totals: ProcTotals = (v.on_ns, *v.off_ns, v.runq_ns, v.voluntary, v.involuntary, *v.hist)
            ev = _proc_delta(pid, now_ns, self._totals.get(pid), totals)
            if ev is not None:
                out.append(ev)
            self._totals[pid] = totals
            if process_gone(pid):
                gone.add(pid)
                _delete(procs, key)
                self._totals.pop(pid, None)
        out.extend(self._read_cpu(now_ns, gone))
        stats = self.ctx.host_stats
        for pid in gone:
            if stats is not None:
                stats.forget(pid)
        return out

    def _read_cpu(self, now_ns: int, gone: set[int]) -> Iterable[SchedCpuStats]:
        table = self.bpf["cpu_time"]
        for key, value in table.items():
            k = (key.tgid, key.cpu)
            delta = value.value - self._cpu_totals.get(k, 0)
            if delta > 0:
                yield SchedCpuStats(k[0], k[1], now_ns, delta)
            self._cpu_totals[k] = value.value
            if k[0] in gone or (k[0] not in self._totals and process_gone(k[0])):
                _delete(table, key)
                self._cpu_totals.pop(k, None)

    def _sample_on_demand(self, pid: int, tid: int) -> None:
        """HostStats' reader (otel_ebpf.host.timeline, "Fresh figures"): one thread's counters
        now, from whichever thread asks; nothing once shutdown has begun."""
        with self._on_demand:
            if self._on_demand_open:
                self.sample_thread(pid, tid)

    def shutdown(self) -> None:
        stats = self.ctx.host_stats
        with self._on_demand:  # a read in progress ends before the program is unloaded
            if self._on_demand_open and stats is not None:
                stats.set_sampler(None)
            self._on_demand_open = False
        self._final_read = True  # the base's last drain reads the counters one more time
        super().shutdown()


def _delete(table: Any, key: Any) -> None:
    try:
        del table[key]
    except KeyError:
        pass


def _proc_delta(pid: int, now_ns: int, old: ProcTotals | None, new: ProcTotals) -> SchedProcStats | None:
    """The increase from ``old`` to ``new`` (all of ``new`` for a first read), or None if none."""
    d = [n - o for n, o in zip(new, old, strict=True)] if old is not None else list(new)
    if not any(x > 0 for x in d):
        return None
    d = [max(0, x) for x in d]
    hist = tuple((slot, n) for slot, n in enumerate(d[8:8 + _HIST_SLOTS]) if n)
    return SchedProcStats(pid, now_ns, d[0], (d[1], d[2], d[3], d[4]), d[5], d[6], d[7], hist)
