"""Configuration of the lifecycle receiver (``receivers: {lifecycle: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    ringbuf_pages: int = doc(
        512, "Ring buffer size in pages, for fork/exec/exit-code records (an exec record is about "
             "1.5 KiB). A full buffer drops records, counted as "
             "otel_ebpf.events.dropped{receiver=lifecycle, reason=ringbuf_full}.", pow2=True)
    max_pending_execs: int = doc(
        1024, "Threads inside execve/execveat at once whose arguments are kept until the call "
              "returns (an LRU map: the oldest is pushed out, and its exec, if it succeeds, is "
              "counted as reason=state_map_full).", min=1)

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
