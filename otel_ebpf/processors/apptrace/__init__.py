"""Application tracepoints processor: AppSpan/AppPoint -> spans in the app's trace (see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

from .config import Config
from .processor import AppTraceProcessor

__all__ = ["AppTraceProcessor", "Config", "factory"]


factory = Factory(type="apptrace", config_class=Config, create=AppTraceProcessor,
                  description="Application tracepoint fires to spans in the app's own trace, and fire counters",
                  default_on=False)
