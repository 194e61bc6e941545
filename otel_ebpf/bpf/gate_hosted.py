"""The library gate compiled into another early receiver's program (issue 18: one compile, not two).

A deferred start compiles the receivers that must see the command from its first instruction (lifecycle, on by
default) and the gate before the command runs; each compile pays clang's fixed cost (~0.25 s here) and the gate's
took 0.5-0.7 s. The gate's program is nothing but common.bpf.c's traced set and library-open watch, which every
program has: so the host (the lifecycle receiver) compiles with the gate's parameters (``-DOE_GATE``, the
patterns, pause_on_load with the gate's pin and guard slot), and :class:`HostedGate` works on the host's program
instead of its own.

What changes against the gate with its own program (otel_ebpf.bpf.gate), and what does not:

* The library-open records arrive on the host's ring buffer. The host's poll thread hands each to the gate
  (:meth:`HostedGate.enqueue`, never blocking: a bounded queue, a full one counted in
  ``otel_ebpf.events.dropped{receiver=gate, reason=gate_queue_full}``; such a process stays stopped until the
  pause guard resumes it within ``pause_timeout``). The gate's own thread waits for the receivers and resumes,
  so the host keeps reading its records while a process is held.
* Every pause_on_load step (the guard lease's renewal, the stops it made, their resume and confirmation,
  the skips read) runs on that one gate thread, as the poll thread does it for a gate with its own program
  (otel_ebpf.bpf.pausing: those steps are single-threaded). The host's own pause_on_load stays off.
* At shutdown the gate marks every pattern open in the program (no stop can be made from then on: the host's
  program lives on), stops its thread, resumes what it holds, and resumes what is still recorded (stops whose
  records it never read) as the gate with its own program does after its detach.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence

from otel_ebpf.bpf import paused as paused_map
from otel_ebpf.bpf.gate import LibraryGate
from otel_ebpf.bpf.maps import array_deltas
from otel_ebpf.bpf.pausing import PAUSES_SKIPPED, SKIP_REASONS
from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.core.pipeline import Context

__all__ = ["QUEUE_MAX", "HostedGate"]

log = logging.getLogger(__name__)
QUEUE_MAX = 4096  # library-open records waiting for the gate's thread
_SLICE_S = 0.05


class HostedGate(LibraryGate):
    """A :class:`LibraryGate` on ``host``'s program. The host calls :meth:`host_cflags` for its compile,
    :meth:`prepare` before it and :meth:`unprepare` when it failed, and :meth:`enqueue` for each
    library-open record; ``start`` after the host started."""

    def __init__(self, ctx: Context, receivers: Sequence[BpfReceiver], host: BpfReceiver) -> None:
        super().__init__(ctx, receivers)
        self.host = host
        self._queue: queue.Queue[bytes] = queue.Queue(QUEUE_MAX)

    # ---- the host's side ---------------------------------------------------------------
    def host_cflags(self) -> list[str]:
        """What the host's program adds to be the gate too (after the host's own flags)."""
        return ["-DOE_PAUSE_ON_LOAD=1", f'-DOE_LIB_PATTERN="{self.lib_pattern}"', *self.cflags(),
                *self._pauses.cflags()]

    def prepare(self) -> None:
        """Before the host compiles: resume stale stops, take the pin and the guard slot."""
        self._pauses.prepare()

    def unprepare(self) -> None:
        """The host's compile failed: give the pin and the guard slot back."""
        self._pauses.unpin()

    def enqueue(self, raw: bytes) -> None:
        """A library-open record the host read (its poll thread): handled on the gate's thread. None once
        the gate is shut down (every pattern is open then: what was still in the ring needs nothing)."""
        if self._stop.is_set():
            return
        try:
            self._queue.put_nowait(raw)
        except queue.Full:
            self.ctx.telemetry.dropped(self.name, "gate_queue_full")
            log.warning("%s: %d library opens wait already; one more is left to the pause guard "
                        "(resumed within service.pause_timeout)", self.name, QUEUE_MAX)

    # ---- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if self._bpf is not None:
            return
        if self.host.bpf is None:
            raise RuntimeError("the gate's host receiver has not started")
        self._bpf = self.host.bpf
        self._pauses.renew()  # the gate's thread starts now: a library opened from here on is resumed
        self._thread = threading.Thread(target=self._serve, name=f"otel-ebpf-{self.name}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self._pauses.renew()
                try:
                    raw = self._queue.get(timeout=_SLICE_S)
                except queue.Empty:
                    raw = None
                if raw is not None:
                    self._library_opened(raw)
                self._pauses.confirm(self._bpf)
                for reason, n in array_deltas(self._bpf["oe_pause_skips"], SKIP_REASONS, self._pauses.skips_seen):
                    self.ctx.telemetry.add(PAUSES_SKIPPED, n, receiver=self.name, reason=reason)
            except Exception:
                log.exception("%s: gate thread error", self.name)

    def shutdown(self) -> None:
        bpf = self._bpf
        if bpf is not None:
            self._open_all(bpf)  # the host's program stops nobody from here on
        self._pauses.revoke()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        held = paused_map.hold(bpf) if bpf is not None else None
        for pid in list(self._pauses.stopped):
            self._resume(pid)
        self._bpf = None  # the host's: it cleans it up
        self._pauses.release(held)  # what is still recorded (never read) is resumed, the pin removed
