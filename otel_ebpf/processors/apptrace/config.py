"""Configuration of the application tracepoints processor (``processors: {apptrace: {}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    point_spans: bool = doc(True, "Emit each point fire as a zero-length span in the app's trace (child of "
                                  "the app span current at the fire); the counter app.tracepoint.fires "
                                  "is emitted either way.")

    def validate(self, path: str) -> None:
        pass
