"""Perf-counter processor: perf counts -> process.cpu.* and process.context_switches counters."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

from .config import Config
from .processor import PerfProcessor

__all__ = ["Config", "PerfProcessor", "factory"]


factory = Factory(type="perf", config_class=Config, create=PerfProcessor,
                  description="Perf counts to process.cpu.* / process.context_switches counters")
