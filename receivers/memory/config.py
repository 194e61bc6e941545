"""Configuration of the memory receiver (``receivers: {memory: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.config import doc
from otel_ebpf.errors import ConfigError

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    interval: float = doc(
        1.0, "How often page-fault counters are read and RSS is sampled from /proc/PID/statm "
             "(plus once at shutdown).", duration=True)
    max_processes: int = doc(
        16384, "Processes whose page faults are counted in the kernel at once. Beyond it faults of "
               "new processes are not counted (otel_ebpf.events.dropped{reason=stats_map_full}).")
    ringbuf_pages: int = doc(8, "Ring buffer size in pages (a power of two); it carries OOM kills only.")

    def validate(self, path: str) -> None:
        def where(key: str) -> str:
            return f"{path}.{key}" if path else key

        if self.max_processes < 1:
            raise ConfigError(where("max_processes"), f"must be >= 1, got {self.max_processes}")
        pages = self.ringbuf_pages
        if pages < 1 or pages & (pages - 1):
            raise ConfigError(where("ringbuf_pages"), f"must be a power of two, got {pages}")
        if self.interval < 0.01:
            raise ConfigError(where("interval"), "must be at least 10ms")
