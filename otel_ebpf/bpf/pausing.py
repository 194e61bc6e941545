"""The pause_on_load side of one BPF receiver: the program stops a process that opens a watched
library (SIGSTOP from BPF, recorded in ``oe_paused``), the receiver attaches its probes and
resumes it, so no early call is missed.

Pieces (each documented in its own module): ``oe_paused``, the per-receiver map of stops
(otel_ebpf.bpf.paused); the pause guard's lease, which lets the supervisor resume stops the
receiver does not resume within ``pause_timeout`` (otel_ebpf.bpf.pauseguard). This class holds
one receiver's part: its pin, its guard slot, the stops it still has to resume or confirm.

Threading: :meth:`prepare` and :meth:`cflags` run before the receiver's poll
thread starts; :meth:`opened`, :meth:`resume`, :meth:`renew` and :meth:`confirm` on the poll
thread (``resume`` also at shutdown, after that thread has been joined); :meth:`revoke` on
the thread shutting down, before the join; :meth:`release` after it. Never raises from the
poll-thread methods but for the kill(2) errors they handle.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from typing import Any

from otel_ebpf.bpf import paused as paused_map
from otel_ebpf.bpf import pauseguard
from otel_ebpf.core.pipeline import Context

__all__ = ["MAX_UNCONFIRMED", "PAUSES_SKIPPED", "PAUSES_TIMED_OUT", "SKIP_REASONS", "PauseOnLoad"]

log = logging.getLogger(__name__)
PAUSES_TIMED_OUT = "otel_ebpf.pauses.timed_out"
PAUSES_SKIPPED = "otel_ebpf.pauses.skipped"
SKIP_REASONS = ("agent_late", "guard_late", "cpu_throttled")  # oe_pause_skips[] indexes in common.bpf.c
MAX_UNCONFIRMED = 4096


class PauseOnLoad:
    """One receiver's stops. ``enabled``: the receiver pauses at all (pause_on_load and a
    library pattern to watch for)."""

    def __init__(self, name: str, ctx: Context, enabled: bool) -> None:
        self.name, self.ctx, self.enabled = name, ctx, enabled
        self.stopped: set[int] = set()  # pids stopped by the program and not resumed yet
        self.skips_seen = [0] * len(SKIP_REASONS)  # oe_pause_skips[] as last read
        self._unconfirmed: dict[tuple[int, int], int] = {}  # (pid, stop ts) resumed -> rounds seen stopped
        self._pin: str | None = None  # oe_paused's bpffs pin while loaded (otel_ebpf.bpf.paused)
        self._guard: pauseguard.PauseGuard | None = None  # while loaded
        self._slot = 0

    @property
    def guarded(self) -> bool:
        """The pause guard covers this receiver (it may make stops): its skips are counted."""
        return self._guard is not None

    def prepare(self) -> None:
        """Before compiling: resume the stops a SIGKILLed agent left behind (before this program
        can make new ones), then take a pin and a guard slot when enabled."""
        paused_map.recover_stale(self.ctx.telemetry)
        if self.enabled and self._pin is None:
            self._pin = paused_map.new_pin(self.name)
        if self.enabled and self._guard is None:
            self._guard = pauseguard.acquire(self.ctx, self.ctx.pause_timeout)
            self._slot = self._guard.new_slot()

    def cflags(self) -> list[str]:
        """The -D parameters naming the pin and the guard slot (none when not prepared)."""
        flags = [f'-DOE_PAUSED_PIN="{self._pin}"'] if self._pin else []
        if self._guard is not None and self._guard.pin:
            flags += [f'-DOE_PAUSE_GUARD_PIN="{self._guard.pin}"', f"-DOE_GUARD_SLOT={self._slot}"]
        return flags

    def renew(self) -> None:
        """The poll loop turns (or is about to): stops made from now on will be resumed."""
        if self._guard is not None:
            self._guard.renew(self._slot)

    def revoke(self) -> None:
        """No new stops from here on (shutdown begins)."""
        if self._guard is not None:
            self._guard.revoke(self._slot)

    def opened(self, pid: int) -> None:
        """The program stopped ``pid`` at a library open."""
        self.stopped.add(pid)

    def resume(self, bpf: Any, pid: int, ts: int | None = None) -> None:
        """SIGCONT ``pid`` stopped at ``ts`` (None: every stop of it, at shutdown). Its record in
        oe_paused (otel_ebpf.bpf.paused) is forgotten only once the process is seen running
        (:meth:`confirm`, next poll round): the kernel may deliver the program's SIGSTOP after
        this SIGCONT (bpf_send_signal defers it to irq_work when preemption is off), and while
        the record stays the pause guard resumes a late stop after pause_timeout. A stop no
        longer recorded was resumed by the pause guard (pause_timeout ran out first): counted in
        otel_ebpf.pauses.timed_out, logged, and not continued again (its user may have stopped
        it since)."""
        self.stopped.discard(pid)
        if ts is not None and not paused_map.recorded(bpf, pid, ts):
            held_s = (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - ts) / 1e9
            self.ctx.telemetry.add(PAUSES_TIMED_OUT, 1, receiver=self.name)
            log.warning("%s: pid %d was resumed by the pause guard after pause_timeout (%.1fs), before its "
                        "probes were attached (%.1fs after its stop): its first calls were not traced",
                        self.name, pid, self.ctx.pause_timeout, held_s)
            return
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            paused_map.forget(bpf, pid, ts)
            return
        if ts is None:
            paused_map.forget(bpf, pid, None)
        elif len(self._unconfirmed) < MAX_UNCONFIRMED:
            self._unconfirmed[(pid, ts)] = 0
        else:  # bounded: forget at once (a late SIGSTOP of this stop is then not covered)
            paused_map.forget(bpf, pid, ts)

    def confirm(self, bpf: Any) -> None:
        """Forget the stops resumed in earlier rounds whose process runs (or is gone); send
        SIGCONT again to one still stopped (its SIGSTOP landed after ours), up to 3 rounds,
        then leave its record to the pause guard."""
        for (pid, ts), rounds in list(self._unconfirmed.items()):
            st = paused_map.process_stat(pid)
            if st is not None and st[0] == "T" and rounds < 3:
                self._unconfirmed[(pid, ts)] = rounds + 1
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
                continue
            del self._unconfirmed[(pid, ts)]
            if st is None or st[0] != "T":
                paused_map.forget(bpf, pid, ts)

    def release(self, held: Any) -> None:
        """After the programs are detached (no new stops): give up the pin (``held``: what
        ``paused.hold`` returned before the detach) and the guard slot. Safe twice."""
        paused_map.release(held, self._pin, self.name)
        self._pin = None
        self.release_guard()

    def release_guard(self) -> None:
        if self._guard is not None:
            self._guard = None
            pauseguard.release(self.ctx)

    def unpin(self) -> None:
        """A load failed: drop the pin taken for it (nothing was stopped) and the guard slot."""
        paused_map.unpin(self._pin)
        self._pin = None
        self.release_guard()
