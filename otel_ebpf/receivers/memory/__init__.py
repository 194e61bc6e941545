"""Memory receiver: page faults (exceptions:page_fault_user, counted in the kernel), RSS
(/proc/PID/statm) and OOM kills (oom:mark_victim) of traced processes (:mod:`.receiver`).
The ``memory`` processor turns the events into process.paging.faults, process.memory.* and
``process.oom_kill`` spans.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import MemoryReceiver

__all__ = ["Config", "MemoryReceiver", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> MemoryReceiver:
    return MemoryReceiver(config, ctx, next_)


# On by default: OOM kills are one tracepoint hit each, RSS and (fault_source 'proc') page faults
# are /proc reads per traced process per interval. fault_source 'tracepoint' is the per-fault
# probe (about 120 ns per untraced and 185 ns per traced fault, host-wide; docs/receivers.md).
factory = Factory(type="memory", config_class=Config, create=create,
                  description="Page faults, RSS and OOM kills (named victims) of traced processes")
