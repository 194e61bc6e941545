"""The library gate of a deferred start: ``run -- CMD`` starts the command before the library
receivers (cuda, nccl, torch) have compiled, and this small program holds any traced
process that opens one of their libraries until that receiver is attached to it.

The gate is a :class:`~otel_ebpf.bpf.receiver.BpfReceiver` whose program is only common.bpf.c's
traced set and library-open watch (gate.bpf.c), with pause_on_load and the patterns of up to
four receivers (``OE_LIB_PATTERN``, ``OE_LIB_PATTERN2..4``). It compiles in a fraction of the
time of the receivers it stands for. When a watched library is opened, the process is stopped
by the program (SIGSTOP, recorded in ``oe_paused``, bounded by the pause guard like every
pause_on_load stop: docs/reliability.md, "The pause guard"), and the gate's poll thread waits
for the library's receiver to be ready (:meth:`LibraryGate.ready`, called by the deferred
starter, otel_ebpf.service.deferred, once it has started or failed), asks that receiver to
attach to the path, then resumes the process: its first call into the library is traced.

Each hold is counted in ``otel_ebpf.gate.held{receiver}`` and logged (INFO) with its length.
Compiling a receiver takes longer than ``service.pause_timeout`` (cuda ~3 s), the longest any
stop may last once the agent stops making progress. So while the starter thread makes progress
(its CPU time grows: it is compiling), the gate re-records every stop it holds (older than a quarter
of pause_timeout) as made now, every half pause_timeout (otel_ebpf.bpf.paused.rekey), those whose opens wait in the ring
buffer behind the one being handled included (one poll thread handles them in turn); the pause
guard's supervisor then counts its timeout from there, and a stop gets a fresh pause_timeout
for its attach once its receiver is ready. An agent that hangs, starves or dies stops the renewals, and the supervisor
resumes the process within pause_timeout as for any stop. A hold never lasts longer than
:data:`HOLD_MAX_S` in all. When a hold ends without the receiver (the supervisor resumed the
process, or the cap), the gate stops waiting: counted in ``otel_ebpf.gate.late{receiver}``, and
the receiver attaches to the library when it starts, from the process's maps, so only the calls
made meanwhile are missed. A process the program did not stop (no current lease) is not waited
for at all: the receiver finds its library the same way. While it waits, the gate
tells the starter which receiver a process waits for, and the starter compiles that one next.
Nothing the gate reads is exported (its records go nowhere): process exits and library loads
come from the receivers themselves.
"""
from __future__ import annotations

import ctypes as ct
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from otel_ebpf.bpf import paused as paused_map
from otel_ebpf.bpf.receiver import _LIBOPEN, BpfReceiver
from otel_ebpf.core.pipeline import Context

__all__ = ["GATE_HELD", "GATE_LATE", "HOLD_MAX_S", "MAX_PATTERNS", "LibraryGate", "thread_cpu"]

log = logging.getLogger(__name__)
MAX_PATTERNS = 4  # OE_LIB_PATTERN, OE_LIB_PATTERN2..4 in common.bpf.c
GATE_LATE = "otel_ebpf.gate.late"
GATE_HELD = "otel_ebpf.gate.held"
_WAIT_SLICE_S = 0.05
HOLD_MAX_S = 60.0  # the longest a gate holds a process, renewals included
_MAX_RENEWED = 4096
FINISH_S = 1.0  # the longest the end of a start waits for the stops still on their way (LibraryGate.finish)


def thread_cpu(thread: threading.Thread) -> float | None:
    """``thread``'s CPU seconds so far; None once it ended."""
    ident = thread.ident
    if ident is None or not thread.is_alive():
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except OSError:
        return None


class _Discard:
    def consume(self, events: Sequence[object]) -> None:
        pass


class LibraryGate(BpfReceiver):
    """Holds the processes that open the library of a receiver in ``receivers`` (at most
    :data:`MAX_PATTERNS`, each with a ``lib_pattern``) until :meth:`ready` is called for it."""

    name = "gate"
    src_file = Path(__file__).with_name("gate.bpf.c")

    def __init__(self, ctx: Context, receivers: Sequence[BpfReceiver]) -> None:
        if not 0 < len(receivers) <= MAX_PATTERNS or not all(r.lib_pattern for r in receivers):
            raise ValueError(f"a gate watches 1 to {MAX_PATTERNS} receivers with a library pattern")
        self.watched = list(receivers)
        self.lib_pattern = self.watched[0].lib_pattern
        self._ready = {id(r): threading.Event() for r in self.watched}
        self._wanted: list[BpfReceiver] = []
        self._lock = threading.Lock()
        self.progress: Callable[[], float | None] = lambda: None  # the starter's CPU seconds (DeferredStart)
        self._stop_at: tuple[int, int, bool] = (0, 0, False)  # (pid, ts, stopped) of the open being handled
        self._rekeyed: dict[tuple[int, int], int] = {}  # (pid, stop ts) -> the ts it is recorded at now
        self._origin: dict[tuple[int, int], int] = {}  # (pid, recorded ts) -> its stop ts, for renewed stops
        super().__init__(ctx, _Discard(), ringbuf_pages=1, pause_on_load=True, poll_interval=0.05)

    def cflags(self) -> list[str]:
        return ["-DOE_GATE=1", *(f'-DOE_LIB_PATTERN{i}="{r.lib_pattern}"' for i, r in enumerate(self.watched[1:], 2))]

    def owner(self, path: str) -> BpfReceiver | None:
        """The watched receiver whose pattern starts the basename of ``path`` (as the program matched it)."""
        base = os.path.basename(path)
        return next((r for r in self.watched if r.lib_pattern and base.startswith(r.lib_pattern)), None)

    def ready(self, receiver: BpfReceiver) -> None:
        """``receiver`` has started (or failed to): processes held for it may go on, and the program
        stops no more for its library (its own program watches it now)."""
        event = self._ready.get(id(receiver))
        if event is None:
            return
        event.set()
        bpf = self._bpf
        if bpf is not None:
            try:
                bpf["oe_gate_open"][ct.c_int(self.watched.index(receiver))] = ct.c_uint8(1)
            except Exception:  # the gate is shutting down: nothing to open
                log.debug("gate: marking %s ready in the program failed", receiver.name, exc_info=True)

    def finish(self, timeout: float = FINISH_S) -> None:
        """The end of a start in which every watched receiver became ready: the program stops nobody
        from here on, and the stops it made whose opens are still on their way (in the ring buffer,
        or queued behind the one the gate's thread was handling) are handled as every hold is (the
        receiver attached to the path, then the resume) for up to ``timeout`` s; then the gate shuts
        down. Without this the shutdown resumed them before their receiver attached to their path
        (a path no other process had opened went untraced until the receiver saw it mapped)."""
        bpf = self._bpf
        if bpf is not None:
            self._open_all(bpf)
            deadline = time.monotonic() + timeout
            while (paused_map.stops(bpf) and time.monotonic() < deadline and self._thread is not None
                   and self._thread.is_alive()):
                time.sleep(_WAIT_SLICE_S)
        self.shutdown()

    def _open_all(self, bpf: Any) -> None:
        """Mark every pattern open in the program: it stops no process any more."""
        try:
            table = bpf["oe_gate_open"]
            for i in range(len(self.watched)):
                table[ct.c_int(i)] = ct.c_uint8(1)
        except Exception:
            log.debug("%s: opening the patterns failed", self.name, exc_info=True)

    def wanted(self) -> BpfReceiver | None:
        """The receiver a held process waits for, longest waiting first (None: none waits)."""
        with self._lock:
            while self._wanted:
                r = self._wanted.pop(0)
                if not self._ready[id(r)].is_set():
                    return r
        return None

    def _library_opened(self, raw: bytes) -> None:
        """The base's handling (attach_library below, then the resume), knowing which stop it is;
        nothing is passed on (the receiver reports its library loads itself)."""
        _, stopped, pid, _tid, ts, _path = _LIBOPEN.unpack_from(raw)
        self._stop_at = (pid, ts, bool(stopped))
        super()._library_opened(raw)

    def _resume(self, pid: int, ts: int | None = None) -> None:
        if ts is not None:
            ts = self._rekeyed.pop((pid, ts), ts)
            self._origin.pop((pid, ts), None)
        super()._resume(pid, ts)

    def attach_library(self, path: str) -> int:
        """Called from the base's library-open handling: wait for the library's receiver while the
        process is held (not when it was not stopped), then have it attach."""
        r = self.owner(path)
        if r is None:
            return 0
        event = self._ready[id(r)]
        pid, ts, stopped = self._stop_at
        if not event.is_set() and not stopped:
            return 0  # it runs on: the receiver finds the library in its maps when it starts
        if not event.is_set():
            with self._lock:
                if r not in self._wanted:
                    self._wanted.append(r)
            t0 = time.monotonic()
            waited = self._wait(event, pid, ts)
            if waited:
                self.ctx.telemetry.add(GATE_HELD, 1, receiver=r.name)
                log.info("%s: held a process that opened %s for %.2fs, until the %s receiver was ready",
                         self.name, path, time.monotonic() - t0, r.name)
            else:
                if self._stop.is_set():  # shutting down: the process is resumed with the gate's other stops
                    return 0
                self.ctx.telemetry.add(GATE_LATE, 1, receiver=r.name)
                log.info("%s: a process opened %s before the %s receiver was ready (%.1fs, "
                         "service.pause_timeout); it went on, and the calls it makes until the receiver "
                         "attaches are not traced", self.name, path, r.name, self.ctx.pause_timeout)
                return 0
        elif stopped:  # stopped before its receiver was ready, handled after: it waited behind another open
            self.ctx.telemetry.add(GATE_HELD, 1, receiver=r.name)
            held_s = (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - ts) / 1e9  # ts: the program's stop time
            log.info("%s: held a process that opened %s for %.2fs (its open queued behind another's), until the %s "
                     "receiver was ready", self.name, path, held_s, r.name)
        if r.bpf is None:
            return 0
        if not stopped:
            return r.attach_library(path)
        return self._attach_held(r, path, pid, ts)

    def _attach_held(self, r: BpfReceiver, path: str, pid: int, ts: int) -> int:
        """``r.attach_library(path)`` on a helper thread while this one renews the held stop as long as
        the attach makes progress (94 uprobes took more than 1.5 s on this 2-core VM under load)."""
        result = [0]

        def attach() -> None:
            try:
                result[0] = r.attach_library(path)
            except Exception:
                log.exception("%s: attaching %s to %s failed", self.name, r.name, path)

        worker = threading.Thread(target=attach, name="otel-ebpf-gate-attach", daemon=True)
        worker.start()
        self._renew_all(only=(pid, ts))
        cpu, last = thread_cpu(worker), time.monotonic()
        while worker.is_alive():
            worker.join(_WAIT_SLICE_S)
            self._pauses.renew()
            now = time.monotonic()
            if worker.is_alive() and now - last >= self.ctx.pause_timeout / 2:
                spent = thread_cpu(worker)
                if spent is not None and cpu is not None and spent > cpu:
                    self._renew_all()  # this stop and those queued behind it
                    cpu, last = spent, now
        return result[0]

    def _wait(self, event: threading.Event, pid: int, ts: int) -> bool:
        """Wait for ``event`` while ``pid`` is held; while the starter makes progress, renew the
        record of every stop the gate holds (the processes whose opens wait behind this one too:
        see the module doc). False: this hold ended first (the guard resumed it, the cap, a shutdown)."""
        start = last = time.monotonic()
        cpu = self.progress()
        while not event.wait(_WAIT_SLICE_S):
            now = time.monotonic()
            if self._stop.is_set() or now - start >= HOLD_MAX_S:
                return False
            self._pauses.renew()
            if now - last < self.ctx.pause_timeout / 2:
                continue
            spent = self.progress()
            if spent is None or cpu is None or spent <= cpu:
                if now - last >= self.ctx.pause_timeout:
                    return False  # no progress: the guard resumes it (or has)
                continue
            self._renew_all()
            if not paused_map.recorded(self._bpf, pid, self._rekeyed.get((pid, ts), ts)):
                return False  # no longer recorded: the guard resumed it
            cpu, last = spent, now
        return True

    def _renew_all(self, only: tuple[int, int] | None = None) -> None:
        """Record the gate's stops (``only``: that one, by its first ts) older than a quarter of
        pause_timeout (all of ``only``) as made now, none held HOLD_MAX_S already. Renewals come
        every half pause_timeout, so a stop is at most ~3/4 of it old when renewed (with half as the
        threshold too, a stop made just after one renewal was skipped by the next and renewed at
        pause_timeout itself: the guard could resume it first)."""
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # the clock of the program's stop ts
        quarter = int(self.ctx.pause_timeout * 1e9 / 4)
        if len(self._rekeyed) > _MAX_RENEWED:  # records never read (a full ring): forget, the guard resumes them
            self._rekeyed.clear()
            self._origin.clear()
        for n, (pid, key) in enumerate(paused_map.stops(self._bpf)):
            first = self._origin.get((pid, key), key)
            if only is not None and only != (pid, first):
                continue
            if (only is None and now - key < quarter) or now - first >= HOLD_MAX_S * 1e9:
                continue
            new = now + n  # distinct keys even for two stops of one process
            if paused_map.rekey(self._bpf, pid, key, new):
                self._origin.pop((pid, key), None)
                self._origin[(pid, new)] = first
                self._rekeyed[(pid, first)] = new
