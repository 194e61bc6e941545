"""Block IO processor: block IO events -> system.disk.* and process.disk.* metrics (see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.pipeline import Consumer, Context, Factory

from .config import Config
from .processor import BlockIoProcessor

__all__ = ["BlockIoProcessor", "Config", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> BlockIoProcessor:
    return BlockIoProcessor(config, ctx, next_)


factory = Factory(type="blockio", config_class=Config, create=create,
                  description="Block IO events to system.disk.* (per device, latency histogram) and "
                              "process.disk.* metrics")
