"""Memory processor: page faults, RSS and OOM kills -> process.* metrics and process.oom_kill spans."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

from .config import Config
from .processor import MemoryProcessor

__all__ = ["Config", "MemoryProcessor", "factory"]


factory = Factory(type="memory", config_class=Config, create=MemoryProcessor,
                  description="Page faults and RSS to process.paging.faults / process.memory.*; "
                              "OOM kills to process.oom_kill spans naming the victim")
