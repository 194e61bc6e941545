"""Configuration of the memory receiver (``receivers: {memory: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    interval: float = doc(
        1.0, "How often page-fault counters are read and RSS is sampled from /proc/PID/statm "
             "(plus once at shutdown).", duration=True, min=0.01)
    max_processes: int = doc(
        16384, "Processes whose page faults are counted in the kernel at once. Beyond it faults of "
               "new processes are not counted (otel_ebpf.events.dropped{reason=stats_map_full}).", min=1)
    fault_source: Literal["proc", "tracepoint"] = doc(
        "proc", "Where page-fault counts come from. 'proc': minflt+majflt read from /proc/PID/stat of "
                "every traced process each interval (no per-fault cost; needs target processes, so "
                "--all-processes counts none). 'tracepoint': exceptions:page_fault_user counted in the "
                "kernel (exact, any process; ~120 ns on EVERY user page fault on the host, traced or not).")
    ringbuf_pages: int = doc(8, "Ring buffer size in pages; it carries OOM kills only.", pow2=True)

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
