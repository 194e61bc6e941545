"""Typed events of the perf-counter receiver. Times are epoch ns."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = ["PerfCount"]


@fast_init
@dataclass(frozen=True, slots=True)
class PerfCount:
    """``delta`` more of counter ``event`` (``cycles``, ``instructions``, ``dtlb_misses``,
    ``task_clock`` in ns, ``context_switches``, ``cpu_migrations``) since the previous read, for
    process ``pid`` and every descendant it started after the counter was opened (perf
    ``inherit``); pid None: the whole host (no target processes). ``delta`` is scaled by
    time_enabled / time_running when the kernel multiplexed the counter (``multiplexed``)."""

    pid: int | None
    event: str
    delta: int
    multiplexed: bool
    time_ns: int
