"""Configuration of the application tracepoints receiver (``receivers: {apptrace: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    libraries: list[str] = doc(
        [], "Extra copies of the SDK's extension (otel_ebpf/tracepoints/_oetp.*.so) to probe, on top of the "
            "agent's own, those mapped by traced processes and those opened later (caught in the kernel).")
    ringbuf_pages: int = doc(64, "Ring buffer size in pages; a full buffer drops records "
                                 "(otel_ebpf.events.dropped{reason=ringbuf_full}).", pow2=True)
    poll_interval: float = doc(0.1, "Longest wait for ring-buffer records per poll round.", duration=True, min=0.001)
    max_open_spans: int = doc(16384, "SDK spans begun and not yet ended, tracked at once; beyond it the "
                                     "oldest is forgotten (reason=open_span_table_full; its end is then "
                                     "counted as end_without_begin).", min=1)
    max_threads: int = doc(16384, "Threads whose current app span is remembered for parenting other "
                                  "receivers' spans (reason=context_store_full beyond it).", min=1)

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
