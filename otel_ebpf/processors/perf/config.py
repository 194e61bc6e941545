"""Configuration of the perf-counter processor (``processors: {perf: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    multiplexed_attribute: bool = doc(
        True, "Mark figures the kernel extrapolated from a multiplexed counter with "
              "perf.multiplexed=true (they are estimates).")

    def validate(self, path: str) -> None:
        """Nothing to check: a bool."""
