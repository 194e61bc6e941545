"""Configuration of the memory processor (``processors: {memory: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    max_processes: int = doc(
        16384, "Processes whose last RSS reading is remembered (to emit process.memory.* as "
               "up-down deltas). Beyond it the oldest is forgotten, counted as "
               "otel_ebpf.events.dropped{receiver=memory, reason=usage_table_full}.", min=1)

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
