"""Perf counts (otel_ebpf/receivers/perf) -> counters; everything else passes unchanged.

Metrics (scope ``otel_ebpf.perf``; on the root process of each traced tree, covering its
descendants; with no target processes the whole host, on the agent's resource, named
``system.*`` instead of ``process.*``):

* ``process.cpu.cycles`` {cycle}, ``process.cpu.instructions`` {instruction},
  ``process.cpu.dtlb.misses`` {miss}: hardware counters (otel-ebpf's names; semconv has none).
* ``process.cpu.task_clock`` s: time on CPU as perf's task clock measures it.
* ``process.context_switches`` {context_switch} (semconv name; voluntary and involuntary
  together, so no ``process.context_switch.type``), ``process.cpu.migrations`` {migration}.

``perf.multiplexed=true`` marks values scaled by time_enabled/time_running.

Threading: single-threaded (the pipeline worker calls ``consume``); ``consume`` never raises.
"""
from __future__ import annotations

from typing import Any

from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles

from ...receivers.perf.events import PerfCount
from .config import Config

__all__ = ["EVENTS", "METRICS", "SCOPE", "PerfProcessor"]

SCOPE = "otel_ebpf.perf"
# perf event -> (its per-process metric name, scale applied to the raw count); the system-wide
# count (pid None) is the same metric named system.* instead of process.*
EVENTS: dict[str, tuple[str, float]] = {
    "cycles": ("process.cpu.cycles", 1.0),
    "instructions": ("process.cpu.instructions", 1.0),
    "dtlb_misses": ("process.cpu.dtlb.misses", 1.0),
    "task_clock": ("process.cpu.task_clock", 1e-9),
    "context_switches": ("process.context_switches", 1.0),
    "cpu_migrations": ("process.cpu.migrations", 1.0),
}
_PROCESS_METRICS: dict[str, MetricSpec] = {
    "process.cpu.cycles": ("counter", "{cycle}", "CPU cycles (hardware counter)."),
    "process.cpu.instructions": ("counter", "{instruction}", "Instructions retired (hardware counter)."),
    "process.cpu.dtlb.misses": ("counter", "{miss}", "Data TLB read misses (hardware counter)."),
    "process.cpu.task_clock": ("counter", "s", "Time on CPU (perf task clock)."),
    "process.context_switches": ("counter", "{context_switch}", "Context switches (perf)."),
    "process.cpu.migrations": ("counter", "{migration}", "Moves between CPUs (perf)."),
}


def _system(name: str) -> str:
    return "system." + name.removeprefix("process.")


# name -> (kind, unit, description): the process.* metrics and their system.* twins
METRICS: dict[str, MetricSpec] = {**_PROCESS_METRICS,
                                  **{_system(name): spec for name, spec in _PROCESS_METRICS.items()}}


class PerfProcessor(EventProcessor[Config]):
    """Processor ``perf``: stateless."""

    NAME = "perf"
    SCOPE = SCOPE
    METRICS = METRICS

    @handles(PerfCount)
    def _count(self, ev: PerfCount, out: list[object]) -> None:
        name, scale = EVENTS[ev.event]
        if ev.pid is None:
            name = _system(name)
        attrs: dict[str, Any] = {}
        if ev.multiplexed and self.config.multiplexed_attribute:
            attrs["perf.multiplexed"] = True
        self.metric(out, ev.pid, name, ev.delta * scale, attrs)
