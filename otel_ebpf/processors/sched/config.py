"""Configuration of the sched processor (``processors: {sched: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc
from otel_ebpf.core.errors import ConfigError

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    process_spans: bool = doc(
        True, "Emit one 'process' span per traced process, from its fork (or first exec) to its "
              "exit, with its command line, exec events and exit code.")
    max_processes: int = doc(
        16384, "Live processes whose lifecycle is remembered at once (about 1 KiB each). Beyond "
               "it the oldest is forgotten without a span, counted as "
               "otel_ebpf.events.dropped{receiver=sched, reason=process_table_full}.")
    max_execs: int = doc(
        8, "Exec events kept per process span (a shell that execs a chain); later ones are "
           "counted in the span's process.sched.execs.dropped attribute.")

    def validate(self, path: str) -> None:
        for key in ("max_processes", "max_execs"):
            if getattr(self, key) < 1:
                where = f"{path}.{key}" if path else key
                raise ConfigError(where, f"must be >= 1, got {getattr(self, key)}")
