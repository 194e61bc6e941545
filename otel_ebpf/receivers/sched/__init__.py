"""Scheduler receiver: sched_switch/sched_wakeup accounting in the kernel (on-CPU time per
core, off-CPU time by reason, run-queue waits, context switches). Tracepoints only. Off by
default: it runs on every context switch of the host. (Fork, exec and exit code of traced
processes are the ``lifecycle`` receiver's, on by default.)

Type name ``sched``; :class:`Config` in :mod:`.config`; events in :mod:`.events`. The
``sched`` processor turns the events into metrics.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import SchedReceiver

__all__ = ["Config", "SchedReceiver", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> SchedReceiver:
    return SchedReceiver(config, ctx, next_)


factory = Factory(type="sched", config_class=Config, create=create,
                  description="Scheduler tracepoints: on/off-CPU time by reason, run-queue latency, "
                              "context switches, CPU cores",
                  default_on=False)
