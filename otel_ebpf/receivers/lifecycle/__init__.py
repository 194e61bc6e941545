"""Lifecycle receiver: fork, exec (with argv read in the kernel) and exit code of traced
processes. Tracepoints only, each run once per fork, exec or exit (never per context switch),
so it is on by default.

Type name ``lifecycle``; :class:`Config` in :mod:`.config`; events in :mod:`.events`. The
``lifecycle`` processor turns the events into one ``process`` span per process.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import LifecycleReceiver

__all__ = ["Config", "LifecycleReceiver", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> LifecycleReceiver:
    return LifecycleReceiver(config, ctx, next_)


factory = Factory(type="lifecycle", config_class=Config, create=create,
                  description="Fork, exec (argv read in the kernel) and exit code of traced processes")
