"""Perf-counter processor: perf counts -> process.cpu.* and process.context_switches counters."""
from __future__ import annotations

from otel_ebpf.pipeline import Consumer, Context, Factory

from .config import Config
from .processor import PerfProcessor

__all__ = ["Config", "PerfProcessor", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> PerfProcessor:
    return PerfProcessor(config, ctx, next_)


factory = Factory(type="perf", config_class=Config, create=create,
                  description="Perf counts to process.cpu.* / process.context_switches counters")
