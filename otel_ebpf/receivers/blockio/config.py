"""Configuration of the block IO receiver (``receivers: {blockio: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    interval: float = doc(
        1.0, "How often the in-kernel block IO counters are read and turned into metrics "
             "(plus once at shutdown).", duration=True, min=0.01)
    max_inflight: int = doc(
        16384, "Block requests in flight tracked at once (LRU: the oldest, e.g. requests merged "
               "away, are forgotten first). A completion whose issue was forgotten is counted as "
               "otel_ebpf.events.dropped{receiver=blockio, reason=no_issue_seen}.", min=1)
    max_devices: int = doc(
        1024, "Distinct (device, operation) histograms in the kernel. Beyond it completions "
              "are not counted (reason=stats_map_full).", min=1)
    max_process_keys: int = doc(
        8192, "Distinct (traced process, device, operation) counters in the kernel. Beyond it "
              "IO of new processes is not attributed (reason=process_map_full).", min=1)

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
