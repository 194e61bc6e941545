"""User-declared probes: config entries naming a uprobe, uretprobe, USDT probe or tracepoint
and the typed arguments to capture become a generated BPF program (:mod:`.codegen`) and
:class:`~.events.ProbeHit` events; the ``probes`` processor turns them into spans/metrics.

Everything is validated before anything is loaded (:mod:`.config`, :mod:`.targets`); the
program is generated only from identifiers, integers and whitelisted type names, so an entry
cannot inject C. Off by default; on with an empty list it loads nothing.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import ArgSpec, Config, ProbeSpec
from .receiver import UserProbesReceiver

__all__ = ["ArgSpec", "Config", "ProbeSpec", "UserProbesReceiver", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> UserProbesReceiver:
    return UserProbesReceiver(config, ctx, next_)


factory = Factory(type="probes", config_class=Config, create=create,
                  description="User-declared uprobes, uretprobes, USDT probes and tracepoints with typed "
                              "arguments (generated BPF, validated before loading)",
                  default_on=False)
