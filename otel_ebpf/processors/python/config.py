"""Configuration of the Python processor (``processors: {python: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    qualify: bool = doc(
        True, "Span names are '<module>.<function>' with the module taken from the file name "
              "(CPython's USDT probes give co_name, not the qualified name); false: the bare co_name.")

    def validate(self, path: str) -> None:
        """Nothing to check beyond types (done by otel_ebpf.core.config)."""
