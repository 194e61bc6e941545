"""Configuration of the PyTorch processor (``processors: {torch: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    spans: bool = doc(True, "Emit a span per operator call (the pytorch.op.duration metric is emitted either way).")

    def validate(self, path: str) -> None:
        """Nothing to check beyond types (done by otel_ebpf.core.config)."""
