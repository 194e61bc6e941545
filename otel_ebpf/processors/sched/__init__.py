"""Sched processor: sched receiver events -> scheduler metrics (see :mod:`.processor`). The
``process`` lifecycle spans are the ``lifecycle`` processor's."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

from .config import Config
from .processor import SchedProcessor

__all__ = ["Config", "SchedProcessor", "factory"]


factory = Factory(type="sched", config_class=Config, create=SchedProcessor,
                  description="Scheduler events to process.cpu.time, process.context_switches, "
                              "process.sched.* metrics",
                  default_on=False)
