"""The perf-counter receiver: cycles, instructions and dTLB misses (hardware) or task clock,
context switches and CPU migrations (software) per traced process tree, via perf_event_open.

Design: one counting fd per (target process, event), opened from Python with ``inherit``, read
every ``interval`` on the receiver's own thread. Chosen over a BPF sched_switch program reading
per-CPU counters because it is correct for forked children with no per-switch cost: the kernel
copies an inherited counter into every child at fork (from its first instruction, like the
traced-PID set) and reading the parent's fd sums the children, live and exited. The price:
figures are per process *tree* (on the root's resource), not per child. Without target
processes (node-agent mode) one counter per CPU counts the whole host (pid None).

Machines without a hardware PMU (most VMs): the hardware events are dropped with ONE log line
``perf counters not supported here: <why>`` and ``otel_ebpf.perf.unsupported{event}`` counts
them; the software events still run. With nothing left to count the receiver stays idle.

Threading: ``start`` opens the counters and starts ``otel-ebpf-perf``; ``shutdown`` (safe
without start and twice) reads once more and closes every fd. ``add_target`` may be called
from any thread.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from otel_ebpf.bpf.maps import Totals
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.host.procfs import process_gone

from . import perfevent
from .config import Config
from .events import PerfCount

__all__ = ["PerfReceiver"]

log = logging.getLogger(__name__)
_BACKPRESSURE_S = 1.0
UNSUPPORTED = "otel_ebpf.perf.unsupported"


class PerfReceiver:
    """Receiver ``perf`` (see the module docstring). ``disabled``: why hardware counters are off."""

    name = "perf"

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        self.config = config
        self.ctx = ctx
        self.next = next_
        self.disabled: str | None = None
        self.events: list[str] = []
        self._lock = threading.Lock()
        # (pid or None, event) -> [fds], last scaled total
        self._fds: dict[tuple[int | None, str], list[int]] = {}
        self._totals: Totals[tuple[int | None, str]] = Totals()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None or self._stop.is_set():
            return
        self.events = self._supported_events()
        if not self.events:
            return
        if self.ctx.target_pids:
            for pid in self.ctx.target_pids:
                self.add_target(pid)
        else:
            self._open_host()
        self._thread = threading.Thread(target=self._run, name="otel-ebpf-perf", daemon=True)
        self._thread.start()

    def _supported_events(self) -> list[str]:
        wanted = list(self.config.events)
        hardware = [e for e in wanted if perfevent.EVENTS[e].hardware]
        if hardware:
            why = perfevent.hardware_unsupported()
            if why is not None:
                self.disabled = why
                log.warning("perf counters not supported here: %s (%s not counted)", why, ", ".join(hardware))
                for event in hardware:
                    self.ctx.telemetry.add(UNSUPPORTED, 1, receiver=self.name, event=event)
                wanted = [e for e in wanted if e not in hardware]
        return wanted

    def add_target(self, pid: int) -> None:
        """Count process ``pid`` and the children it starts from now on."""
        with self._lock:
            if any(k[0] == pid for k in self._fds):
                return
            if len({k[0] for k in self._fds}) >= self.config.max_processes:
                self.ctx.telemetry.dropped(self.name, "counter_limit")
                return
            for event in self.events:
                try:
                    self._fds[(pid, event)] = [perfevent.open_counter(event, pid)]
                except OSError as exc:
                    log.warning("perf: cannot count %s of pid %d: %s", event, pid, exc.strerror or exc)
                    self.ctx.telemetry.dropped(self.name, "open_failed")

    def _open_host(self) -> None:
        for event in self.events:
            fds = []
            for cpu in range(os.cpu_count() or 1):
                try:
                    fds.append(perfevent.open_counter(event, -1, cpu, inherit=False))
                except OSError as exc:  # an offline CPU, or no permission
                    log.debug("perf: %s on cpu %d: %s", event, cpu, exc)
            if fds:
                self._fds[(None, event)] = fds

    def shutdown(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10)
        with self._lock:
            for fds in self._fds.values():
                for fd in fds:
                    perfevent.close(fd)
            self._fds.clear()

    # ---- reading --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.config.interval):
            self._send(self.read_once())
        self._send(self.read_once())  # the last figures, so a short run exports them

    def read_once(self) -> list[PerfCount]:
        """Deltas of every counter since the previous read; counters of trees whose root is
        gone are read one last time and closed."""
        now_ns = time.time_ns()
        out = []
        with self._lock:
            for key, fds in list(self._fds.items()):
                total, multiplexed = 0, False
                for fd in fds:
                    try:
                        value, enabled, running = perfevent.read_counter(fd)
                    except OSError:
                        self.ctx.telemetry.dropped(self.name, "read_error")
                        continue
                    if running and running < enabled:
                        value, multiplexed = value * enabled // running, True
                    total += value
                delta = self._totals.update(key, (total,))[0][0]
                if delta > 0:
                    out.append(PerfCount(key[0], key[1], delta, multiplexed, now_ns))
                if key[0] is not None and process_gone(key[0]):
                    for fd in fds:
                        perfevent.close(fd)
                    del self._fds[key]
                    self._totals.forget(key)
        return out

    def _send(self, records: list[PerfCount]) -> None:
        if not records:
            return
        self.ctx.telemetry.add("otel_ebpf.events.received", len(records), receiver=self.name)
        if getattr(self.next, "backpressure", False):
            self.next.consume(records, block_s=_BACKPRESSURE_S)  # type: ignore[call-arg]
        else:
            self.next.consume(records)

