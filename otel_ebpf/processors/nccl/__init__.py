"""NCCL processor: receiver events -> spans (joined across ranks by derived ids) and metrics.

Type name ``nccl``; :class:`Config` in :mod:`.config`; id derivations in :mod:`.comms`.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

from .config import Config
from .processor import NcclProcessor, create

__all__ = ["Config", "NcclProcessor", "factory"]

factory = Factory(type="nccl", config_class=Config, create=create,
                  description="NCCL events to spans with cross-rank join ids, and metrics")
