"""Kernel monotonic time to epoch nanoseconds, in one place.

BPF programs stamp events with ``bpf_ktime_get_ns()`` (CLOCK_MONOTONIC). Spans need epoch
time (CLOCK_REALTIME). The offset between the two is measured once at start, as the
narrowest of several bracketed reads, and can be re-measured (``recalibrate``) when the wall
clock is stepped. CLOCK_MONOTONIC is rate-adjusted by NTP like REALTIME, so between steps the
offset holds. Cross-node accuracy is that of the hosts' clock sync (NTP: ~ms; PTP: ~µs),
which bounds how well skew between ranks on different nodes can be measured.
"""
from __future__ import annotations

import time

__all__ = ["KernelClock"]


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
