"""Configuration of the user-declared probes processor (``processors: {probes: {}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """What each probe produces is declared on its receiver entry (span, metric, value)."""

    metric_attributes: bool = doc(
        True, "Put the captured arguments (probe.arg.<name>) on metrics too. Each distinct value "
              "is its own series: turn off for arguments with many values (sizes, pointers).")

    def validate(self, path: str) -> None:
        pass
