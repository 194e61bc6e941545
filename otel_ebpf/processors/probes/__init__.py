"""User-declared probes processor: ProbeHit -> spans and metrics (see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

from .config import Config
from .processor import UserProbesProcessor

__all__ = ["Config", "UserProbesProcessor", "factory"]


factory = Factory(type="probes", config_class=Config, create=UserProbesProcessor,
                  description="User-declared probe hits to spans (<name>) and counters/histograms",
                  default_on=False)
