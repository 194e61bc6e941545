"""Typed events of the sched receiver: one frozen dataclass per kind. (Fork, exec and exit code
are the lifecycle receiver's events: otel_ebpf/receivers/lifecycle/events.py.)

Times are Unix epoch nanoseconds. Durations are nanoseconds. Statistics events carry the
increase since the previous one of the same process (deltas), read from in-kernel maps.
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = ["OFF_CPU_REASONS", "SchedCpuStats", "SchedProcStats"]

# Index = SCHED_R_* in sched.h.
OFF_CPU_REASONS = ("sleep", "io", "lock", "other")


@fast_init
@dataclass(frozen=True, slots=True)
class SchedProcStats:
    """Scheduler figures of process ``pid`` since the previous event (deltas).

    ``off_cpu_ns``: blocked time per reason (:data:`OFF_CPU_REASONS` order), credited when the
    thread is woken. ``runq_ns``: time runnable but waiting for a CPU. ``runq_hist``: (slot,
    count) pairs, slot i counting waits in [2^i, 2^(i+1)) ns."""

    pid: int
    time_ns: int
    on_cpu_ns: int
    off_cpu_ns: tuple[int, int, int, int]
    runq_ns: int
    voluntary: int
    involuntary: int
    runq_hist: tuple[tuple[int, int], ...]


@fast_init
@dataclass(frozen=True, slots=True)
class SchedCpuStats:
    """``on_cpu_ns`` more nanoseconds process ``pid`` ran on logical CPU ``cpu`` (delta)."""

    pid: int
    cpu: int
    time_ns: int
    on_cpu_ns: int
