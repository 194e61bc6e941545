"""Configuration of the application tracepoints receiver (``receivers: {apptrace: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc
from otel_ebpf.core.errors import ConfigError

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    libraries: list[str] = doc(
        [], "Extra copies of the SDK's extension (otel_ebpf/tracepoints/_oetp.*.so) to probe, on top of the "
            "agent's own, those mapped by traced processes and those opened later (caught in the kernel).")
    ringbuf_pages: int = doc(64, "Ring buffer size in pages (a power of two); a full buffer drops records "
                                 "(otel_ebpf.events.dropped{reason=ringbuf_full}).")
    poll_interval: float = doc(0.1, "Longest wait for ring-buffer records per poll round.", duration=True)
    max_open_spans: int = doc(16384, "SDK spans begun and not yet ended, tracked at once; beyond it the "
                                     "oldest is forgotten (reason=open_span_table_full; its end is then "
                                     "counted as end_without_begin).")
    max_threads: int = doc(16384, "Threads whose current app span is remembered for parenting other "
                                  "receivers' spans (reason=context_store_full beyond it).")

    def validate(self, path: str) -> None:
        def where(key: str) -> str:
            return f"{path}.{key}" if path else key

        pages = self.ringbuf_pages
        if pages < 1 or pages & (pages - 1):
            raise ConfigError(where("ringbuf_pages"), f"must be a power of two, got {pages}")
        for key in ("max_open_spans", "max_threads"):
            if getattr(self, key) < 1:
                raise ConfigError(where(key), f"must be >= 1, got {getattr(self, key)}")
        if self.poll_interval < 0.001:
            raise ConfigError(where("poll_interval"), "must be at least 1ms")
