"""Block IO processor: block IO events -> system.disk.* and process.disk.* metrics (see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

from .config import Config
from .processor import BlockIoProcessor

__all__ = ["BlockIoProcessor", "Config", "factory"]


factory = Factory(type="blockio", config_class=Config, create=BlockIoProcessor,
                  description="Block IO events to system.disk.* (per device, latency histogram) and "
                              "process.disk.* metrics")
