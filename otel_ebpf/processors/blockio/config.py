"""Configuration of the block IO processor (``processors: {blockio: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    latency_histogram: bool = doc(
        True, "Emit system.disk.operation.duration (per device and operation, from the in-kernel "
              "log2 histogram). The counters are emitted either way.")

    def validate(self, path: str) -> None:
        """Nothing to check: a bool."""
