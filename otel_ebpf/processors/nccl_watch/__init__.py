"""nccl_watch processor: the live Python stack of a rank silent in NCCL, as OTel log records (see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .processor import NcclWatchProcessor

__all__ = ["Config", "NcclWatchProcessor", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> NcclWatchProcessor:
    return NcclWatchProcessor(config, ctx, next_)


factory = Factory(type="nccl_watch", config_class=Config, create=create,
                  description="A rank (process) that made no NCCL call for longer than its threshold: its "
                              "Python stack (py-spy, every thread) as an otel_ebpf.nccl.rank.stack log record "
                              "per communicator; after nccl in the pipeline")
