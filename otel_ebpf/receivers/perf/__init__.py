"""Perf-counter receiver: cycles, instructions, dTLB misses (hardware PMU) and task clock,
context switches, CPU migrations (software) per traced process tree (:mod:`.receiver`).
On machines without a PMU it says "perf counters not supported here" once.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import PerfReceiver

__all__ = ["Config", "PerfReceiver", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> PerfReceiver:
    return PerfReceiver(config, ctx, next_)


# Off by default: most VMs have no PMU (it would only say so), and the cost of counting with a
# PMU (its state saved and restored at each context switch of a traced process) was not measured.
factory = Factory(type="perf", config_class=Config, create=create,
                  description="CPU perf counters (cycles, instructions, dTLB misses; software: task clock, "
                              "context switches) per traced process tree",
                  default_on=False)
