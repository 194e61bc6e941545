"""Configuration of the perf-counter receiver (``receivers: {perf: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc, key_path
from otel_ebpf.core.errors import ConfigError

__all__ = ["Config"]

HARDWARE_EVENTS = ("cycles", "instructions", "dtlb_misses")
SOFTWARE_EVENTS = ("task_clock", "context_switches", "cpu_migrations")


@dataclass
class Config:
    """Every default lives here and is documented here."""

    events: list[str] = doc(
        list(HARDWARE_EVENTS),
        "Counters per traced process tree. Hardware (need a PMU; virtual machines often have none): "
        "cycles, instructions, dtlb_misses (dTLB read misses). Software (always there): task_clock, "
        "context_switches, cpu_migrations. Where the hardware ones cannot be opened the receiver "
        "says so once ('perf counters not supported here: ...') and keeps the software ones.")
    interval: float = doc(1.0, "How often the counters are read (plus once at shutdown).", duration=True,
                          min=0.01)
    max_processes: int = doc(
        1024, "Traced process trees with their own counters (one file descriptor per counter each). "
              "Beyond it new trees are not counted (otel_ebpf.events.dropped{receiver=perf, "
              "reason=counter_limit}).", min=1)

    def validate(self, path: str) -> None:
        known = HARDWARE_EVENTS + SOFTWARE_EVENTS
        for i, name in enumerate(self.events):
            if name not in known:
                raise ConfigError(f"{key_path(path, 'events')}[{i}]",
                                  f"unknown perf event {name!r} (known: {', '.join(known)})")
        if len(set(self.events)) != len(self.events):
            raise ConfigError(key_path(path, "events"), "an event is listed twice")
