"""Configuration of the NVML receiver (``receivers: {nvml: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    interval: float = doc(
        10.0, "How often every GPU is read through NVML (one scrape: ~20 NVML calls per GPU).",
        duration=True, min=0.1)
    processes: Literal["traced", "all", "none"] = doc(
        "traced", "Per-process GPU memory and utilization (on the process's own resource, beside its "
                  "spans): 'traced' for the processes otel-ebpf traces (the command and its children, "
                  "--pid trees; every process with --all-processes), 'all' for every process NVML "
                  "lists, 'none' to skip the per-process calls.")
    xid_events: bool = doc(
        True, "Listen for XID errors with NVML's event API (its own thread, blocked in "
              "nvmlEventSetWait) and count them as hw.errors{error.type=xid_<n>}, with a warning line.")
    event_wait: float = doc(
        0.5, "Longest single wait in nvmlEventSetWait: bounds how long shutdown waits for the event "
             "thread. Events are delivered as soon as they happen either way.", duration=True,
        min=0.01, max=60)
    library: str = doc(
        "", "Path of libnvidia-ml.so.1 to load instead of the one the dynamic loader finds (e.g. a "
            "driver container's /run/nvidia/driver/usr/lib64/libnvidia-ml.so.1). Empty: the loader's.")

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
