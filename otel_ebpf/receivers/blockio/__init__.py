"""Block IO receiver: tracepoints block:block_getrq, block_bio_frontmerge and
block_rq_insert/issue/complete -> per-device latency histograms and per-process IO bytes and
time, aggregated in the kernel (:mod:`.receiver`).
The ``blockio`` processor turns the events into ``system.disk.*`` and ``process.disk.*`` metrics.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import BlockIoReceiver

__all__ = ["BlockIoReceiver", "Config", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> BlockIoReceiver:
    return BlockIoReceiver(config, ctx, next_)


factory = Factory(type="blockio", config_class=Config, create=create,
                  description="Block IO (block_rq_* tracepoints): per-device latency histograms, "
                              "per-process IO bytes and time, aggregated in the kernel")
