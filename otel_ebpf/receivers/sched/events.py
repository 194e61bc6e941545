"""Typed events of the sched receiver: one frozen dataclass per kind.

Times are Unix epoch nanoseconds. Durations are nanoseconds. Statistics events carry the
increase since the previous one of the same process (deltas), read from in-kernel maps.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OFF_CPU_REASONS", "SchedCpuStats", "SchedExec", "SchedExitCode", "SchedFork", "SchedProcStats"]

# Index = SCHED_R_* in sched.h.
OFF_CPU_REASONS = ("sleep", "io", "lock", "other")


@dataclass(frozen=True, slots=True)
class SchedFork:
    """Traced process ``ppid`` created process ``pid`` (``comm``: the parent's name)."""

    pid: int
    ppid: int
    time_ns: int
    comm: str


@dataclass(frozen=True, slots=True)
class SchedExec:
    """Process ``pid`` (thread ``tid``) successfully exec'd ``filename`` with ``argv`` as the
    caller passed it, read in the kernel. ``truncated``: more or longer arguments than kept."""

    pid: int
    tid: int
    time_ns: int
    filename: str
    argv: tuple[str, ...]
    truncated: bool


@dataclass(frozen=True, slots=True)
class SchedExitCode:
    """Process ``pid`` called exit_group(``exit_code``) (the low 8 bits, as its parent sees)."""

    pid: int
    time_ns: int
    exit_code: int


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


@dataclass(frozen=True, slots=True)
class SchedCpuStats:
    """``on_cpu_ns`` more nanoseconds process ``pid`` ran on logical CPU ``cpu`` (delta)."""

    pid: int
    cpu: int
    time_ns: int
    on_cpu_ns: int
