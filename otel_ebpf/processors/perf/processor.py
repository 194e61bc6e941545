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

from otel_ebpf.core.events import MetricRecord
from otel_ebpf.core.processing import EventProcessor, handles

from ...receivers.perf.events import PerfCount
from .config import Config

__all__ = ["METRICS", "SCOPE", "PerfProcessor"]

SCOPE = "otel_ebpf.perf"
# event -> (metric name, unit, description, scale applied to the raw count)
METRICS: dict[str, tuple[str, str, str, float]] = {
    "cycles": ("process.cpu.cycles", "{cycle}", "CPU cycles (hardware counter).", 1.0),
    "instructions": ("process.cpu.instructions", "{instruction}", "Instructions retired (hardware counter).", 1.0),
    "dtlb_misses": ("process.cpu.dtlb.misses", "{miss}", "Data TLB read misses (hardware counter).", 1.0),
    "task_clock": ("process.cpu.task_clock", "s", "Time on CPU (perf task clock).", 1e-9),
    "context_switches": ("process.context_switches", "{context_switch}", "Context switches (perf).", 1.0),
    "cpu_migrations": ("process.cpu.migrations", "{migration}", "Moves between CPUs (perf).", 1.0),
}


class PerfProcessor(EventProcessor[Config]):
    """Processor ``perf``: stateless."""

    NAME = "perf"

    @handles(PerfCount)
    def _count(self, ev: PerfCount, out: list[object]) -> None:
        name, unit, description, scale = METRICS[ev.event]
        if ev.pid is None:
            name = "system." + name.removeprefix("process.")
        attrs: dict[str, Any] = {}
        if ev.multiplexed and self.config.multiplexed_attribute:
            attrs["perf.multiplexed"] = True
        out.append(MetricRecord(ev.pid, name, "counter", ev.delta * scale, attrs, unit=unit,
                                description=description, scope=SCOPE))
