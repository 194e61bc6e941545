"""Configuration of the memory processor (``processors: {memory: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc
from otel_ebpf.core.errors import ConfigError

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    max_processes: int = doc(
        16384, "Processes whose last RSS reading is remembered (to emit process.memory.* as "
               "up-down deltas). Beyond it the oldest is forgotten, counted as "
               "otel_ebpf.events.dropped{receiver=memory, reason=usage_table_full}.")

    def validate(self, path: str) -> None:
        if self.max_processes < 1:
            key = f"{path}.max_processes" if path else "max_processes"
            raise ConfigError(key, f"must be >= 1, got {self.max_processes}")
