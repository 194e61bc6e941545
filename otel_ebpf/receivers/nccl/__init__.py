"""NCCL receiver: uprobes on libnccl.so.2 (communicators, collectives, send/recv, groups).

Type name ``nccl``; :class:`Config` in :mod:`.config`; events in :mod:`.events`.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import NcclReceiver

__all__ = ["Config", "NcclReceiver", "factory"]


def _create(config: Config, ctx: Context, next_: Consumer) -> NcclReceiver:
    return NcclReceiver(ctx, next_, config)


factory = Factory(type="nccl", config_class=Config, create=_create,
                  description="NCCL communicators, collectives, send/recv and groups (uprobes)")
