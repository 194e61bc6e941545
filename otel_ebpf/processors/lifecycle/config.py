"""Configuration of the lifecycle processor (``processors: {lifecycle: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    process_spans: bool = doc(
        True, "Emit one 'process' span per traced process, from its fork (or first exec) to its "
              "exit, with its command line (redacted), exec events and exit code.")
    max_processes: int = doc(
        16384, "Live processes whose lifecycle is remembered at once (about 1 KiB each). Beyond "
               "it the oldest is forgotten without a span, counted as "
               "otel_ebpf.events.dropped{receiver=lifecycle, reason=process_table_full}.", min=1)
    max_execs: int = doc(
        8, "Exec events kept per process span (a shell that execs a chain); later ones are "
           "counted in the span's process.lifecycle.execs.dropped attribute.", min=1)

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
