"""User-declared probes processor: ProbeHit -> spans and metrics (see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.pipeline import Consumer, Context, Factory

from .config import Config
from .processor import UserProbesProcessor

__all__ = ["Config", "UserProbesProcessor", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> UserProbesProcessor:
    return UserProbesProcessor(config, ctx, next_)


factory = Factory(type="probes", config_class=Config, create=create,
                  description="User-declared probe hits to spans (<name>) and counters/histograms",
                  default_on=False)
