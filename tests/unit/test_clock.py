"""otel_ebpf.bpf.clock: kernel monotonic time to epoch nanoseconds."""
from __future__ import annotations

import time

from otel_ebpf.bpf.clock import KernelClock

MS = 1_000_000


def test_now_converts_to_wall_clock_within_5ms():
    clock = KernelClock()
    epoch = clock.to_epoch_ns(clock.now_monotonic_ns())
    assert abs(epoch - time.time_ns()) < 5 * MS


def test_offset_is_wall_minus_monotonic():
    clock = KernelClock()
    assert abs(clock.offset_ns - (time.time_ns() - time.monotonic_ns())) < 5 * MS
    assert clock.to_epoch_ns(0) == clock.offset_ns
    assert clock.to_epoch_ns(123) - clock.to_epoch_ns(0) == 123  # a pure shift: durations are kept


def test_recalibrate_stays_sane():
    clock = KernelClock()
    before = clock.offset_ns
    clock.recalibrate()
    assert abs(clock.offset_ns - before) < 5 * MS
    assert abs(clock.to_epoch_ns(time.monotonic_ns()) - time.time_ns()) < 5 * MS
