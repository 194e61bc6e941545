"""Configuration of the memory receiver (``receivers: {memory: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc
from otel_ebpf.core.errors import ConfigError

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
    fault_source: str = doc(
        "proc", "Where page-fault counts come from. 'proc': minflt+majflt read from /proc/PID/stat of "
                "every traced process each interval (no per-fault cost; needs target processes, so "
                "--all-processes counts none). 'tracepoint': exceptions:page_fault_user counted in the "
                "kernel (exact, any process; ~120 ns on EVERY user page fault on the host, traced or not).")
    ringbuf_pages: int = doc(8, "Ring buffer size in pages (a power of two); it carries OOM kills only.")

    def validate(self, path: str) -> None:
        def where(key: str) -> str:
            return f"{path}.{key}" if path else key

        if self.max_processes < 1:
            raise ConfigError(where("max_processes"), f"must be >= 1, got {self.max_processes}")
        pages = self.ringbuf_pages
        if pages < 1 or pages & (pages - 1):
            raise ConfigError(where("ringbuf_pages"), f"must be a power of two, got {pages}")
        if self.fault_source not in ("proc", "tracepoint"):
            raise ConfigError(where("fault_source"), f"must be 'proc' or 'tracepoint', got {self.fault_source!r}")
        if self.interval < 0.01:
            raise ConfigError(where("interval"), "must be at least 10ms")
