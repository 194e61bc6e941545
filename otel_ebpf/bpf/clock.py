"""Kernel monotonic time to epoch nanoseconds, in one place.

BPF programs stamp events with ``bpf_ktime_get_ns()`` (CLOCK_MONOTONIC). Spans need epoch
time (CLOCK_REALTIME). The offset between the two is measured at start, as the narrowest of
several bracketed reads. NTP's slewing moves both clocks alike, so between steps the offset
holds; a step of the wall clock (chrony's or ntpd's ``makestep`` once the daemon syncs, often
after an agent started at boot; ``date -s``; a VM resumed or migrated, during which the wall
clock moved and the monotonic one did not) changes it. Each receiver's poll loop therefore asks
:meth:`KernelClock.check` every turn; at most once every :data:`CHECK_EVERY_NS` it reads the two
clocks once more, and when that read is narrow (:data:`NARROW_NS`) and differs from the offset by
more than :data:`STEP_NS`, it measures the offset again. Spans stamped from then on carry the
new wall time; records read before are not changed. Each step is counted once
(``otel_ebpf.clock.steps``, by the receiver whose poll loop found it) and logged with its size.
One clock serves every receiver of an agent (``Context.clock``, made by the
Agent or the Python API's Session; :func:`shared` makes it for a context built without one),
so a kernel time one program shares with another (oe_thread_ctx: the enclosing Python /
PyTorch call of a CUDA call) becomes the same epoch ns in each, hence the same derived ids.
Cross-node accuracy is that of the hosts' clock sync (NTP: ~ms; PTP: ~µs),
which bounds how well skew between ranks on different nodes can be measured.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from otel_ebpf.core.pipeline import Context
from otel_ebpf.core.services import KernelTime

__all__ = ["CHECK_EVERY_NS", "NARROW_NS", "STEP_NS", "KernelClock", "shared"]

CHECK_EVERY_NS = 1_000_000_000  # how often the poll loops' check reads the clocks again
STEP_NS = 1_000_000  # a change of the offset past this is a step (a narrow read is good to ~NARROW_NS / 2)
NARROW_NS = 50_000  # a check's read wider than this (the thread was preempted between its reads) is not used

Now = Callable[[], int]


def _read(mono: Now, wall: Now) -> tuple[int, int]:
    """(wall - monotonic at the midpoint, the bracket's width) of one bracketed read."""
    m0 = mono()
    r = wall()
    m1 = mono()
    gap = m1 - m0
    return r - (m0 + gap // 2), gap


def _measure_offset(samples: int = 7, mono: Now = time.monotonic_ns, wall: Now = time.time_ns) -> int:
    """The offset of the narrowest of ``samples`` bracketed reads."""
    return min((_read(mono, wall) for _ in range(samples)), key=lambda r: r[1])[0]


class KernelClock:
    """Converts ``bpf_ktime_get_ns()`` values to Unix epoch ns. Reads are thread-safe (``offset_ns`` is replaced
    whole); :meth:`check` may be called from every poll thread. ``mono``/``wall``: the clocks (tests)."""

    def __init__(self, mono: Now = time.monotonic_ns, wall: Now = time.time_ns) -> None:
        self._mono, self._wall = mono, wall
        self.offset_ns = _measure_offset(mono=mono, wall=wall)
        self.steps = 0
        self._lock = threading.Lock()
        self._next_check = mono() + CHECK_EVERY_NS

    def recalibrate(self) -> None:
        self.offset_ns = _measure_offset(mono=self._mono, wall=self._wall)

    def check(self) -> int:
        """Re-measure the offset if the wall clock was stepped since the last check; at most once every
        :data:`CHECK_EVERY_NS` (a cheaper call otherwise: one monotonic read). Returns the step in ns (new offset
        minus old) to the one caller that found it, 0 to everyone else."""
        now = self._mono()
        if now < self._next_check or not self._lock.acquire(blocking=False):
            return 0
        try:
            if now < self._next_check:  # another thread checked meanwhile
                return 0
            self._next_check = now + CHECK_EVERY_NS
            offset, gap = _read(self._mono, self._wall)
            if gap > NARROW_NS or abs(offset - self.offset_ns) <= STEP_NS:
                return 0
            old = self.offset_ns
            self.recalibrate()
            step = self.offset_ns - old
            if abs(step) <= STEP_NS:  # the single read was off, the careful one says no step
                self.offset_ns = old
                return 0
            self.steps += 1
            return step
        finally:
            self._lock.release()

    def to_epoch_ns(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.offset_ns

    def now_monotonic_ns(self) -> int:
        return self._mono()


def shared(ctx: Context) -> KernelTime:
    """``ctx.clock``; a context without one gets a :class:`KernelClock` now, kept there for every
    later receiver of that context. Call it where receivers are made (one thread)."""
    if ctx.clock is None:
        ctx.clock = KernelClock()
    return ctx.clock
