"""Memory processor: page faults, RSS and OOM kills -> process.* metrics and process.oom_kill spans."""
from __future__ import annotations

from otel_ebpf.pipeline import Consumer, Context, Factory

from .config import Config
from .processor import MemoryProcessor

__all__ = ["Config", "MemoryProcessor", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> MemoryProcessor:
    return MemoryProcessor(config, ctx, next_)


factory = Factory(type="memory", config_class=Config, create=create,
                  description="Page faults and RSS to process.paging.faults / process.memory.*; "
                              "OOM kills to process.oom_kill spans naming the victim")
