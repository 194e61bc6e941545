"""Kernel monotonic time to epoch nanoseconds, in one place.

BPF programs stamp events with ``bpf_ktime_get_ns()`` (CLOCK_MONOTONIC). Spans need epoch
time (CLOCK_REALTIME). The offset between the two is measured once at start, as the
narrowest of several bracketed reads, and can be re-measured (``recalibrate``) when the wall
clock is stepped. CLOCK_MONOTONIC is rate-adjusted by NTP like REALTIME, so between steps the
offset holds. One clock serves every receiver of an agent (``Context.clock``, made by the
Agent or the Python API's Session; :func:`shared` makes it for a context built without one),
so a kernel time one program shares with another (oe_thread_ctx: the enclosing Python /
PyTorch call of a CUDA call) becomes the same epoch ns in each, hence the same derived ids.
Cross-node accuracy is that of the hosts' clock sync (NTP: ~ms; PTP: ~µs),
which bounds how well skew between ranks on different nodes can be measured.
"""
from __future__ import annotations

import time

from otel_ebpf.core.pipeline import Context
from otel_ebpf.core.services import KernelTime

__all__ = ["KernelClock", "shared"]


def _measure_offset(samples: int = 7) -> int:
    best_gap: int | None = None
    best = 0
    for _ in range(samples):
        m0 = time.monotonic_ns()
        r = time.time_ns()
        m1 = time.monotonic_ns()
        gap = m1 - m0
        if best_gap is None or gap < best_gap:
            best_gap, best = gap, r - (m0 + gap // 2)
    return best


class KernelClock:
    """Converts ``bpf_ktime_get_ns()`` values to Unix epoch ns. Thread-safe (immutable reads)."""

    def __init__(self) -> None:
        self.offset_ns = _measure_offset()

    def recalibrate(self) -> None:
        self.offset_ns = _measure_offset()

    def to_epoch_ns(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.offset_ns

    def now_monotonic_ns(self) -> int:
        return time.monotonic_ns()


def shared(ctx: Context) -> KernelTime:
    """``ctx.clock``; a context without one gets a :class:`KernelClock` now, kept there for every
    later receiver of that context. Call it where receivers are made (one thread)."""
    if ctx.clock is None:
        ctx.clock = KernelClock()
    return ctx.clock
