"""Application tracepoints receiver: fires of the SDK (:mod:`otel_ebpf.tracepoints`) ->
AppPoint/AppSpan events in the app's own trace, and the per-thread current app span on
``ctx.app_context`` so CUDA spans of that thread become its children."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import AppTraceReceiver

__all__ = ["AppTraceReceiver", "Config", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> AppTraceReceiver:
    return AppTraceReceiver(config, ctx, next_)


factory = Factory(type="apptrace", config_class=Config, create=create,
                  description="Application tracepoints (otel_ebpf.tracepoints SDK, USDT otel_ebpf:event): "
                              "app spans/events joined to the app's trace; parent of CUDA spans",
                  default_on=False)
