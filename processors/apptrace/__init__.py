"""Application tracepoints processor: AppSpan/AppPoint -> spans in the app's trace (see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.pipeline import Consumer, Context, Factory

from .config import Config
from .processor import AppTraceProcessor

__all__ = ["AppTraceProcessor", "Config", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> AppTraceProcessor:
    return AppTraceProcessor(config, ctx, next_)


factory = Factory(type="apptrace", config_class=Config, create=create,
                  description="Application tracepoint fires to spans in the app's own trace, and fire counters",
                  default_on=False)
