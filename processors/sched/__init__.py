"""Sched processor: sched receiver events -> scheduler metrics and ``process`` lifecycle spans
(see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.pipeline import Consumer, Context, Factory

from .config import Config
from .processor import SchedProcessor

__all__ = ["Config", "SchedProcessor", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> SchedProcessor:
    return SchedProcessor(config, ctx, next_)


factory = Factory(type="sched", config_class=Config, create=create,
                  description="Scheduler events to process.cpu.time, process.context_switches, "
                              "process.sched.* metrics and per-process lifecycle spans",
                  default_on=False)
