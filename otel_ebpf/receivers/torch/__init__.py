"""PyTorch receiver: uprobes on libtorch_cpu's dispatcher entry points at::_ops::<op>::call for a
configurable operator list -> typed :class:`~.events.TorchOp` events, paired and nested in the
kernel per thread. Cost grows with the operator call rate, so it is off by default: enable it
by naming it in ``service.pipelines``. The ``torch`` processor turns the events into spans.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import DEFAULT_OPS, Config
from .receiver import TorchReceiver

__all__ = ["DEFAULT_OPS", "Config", "TorchReceiver", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> TorchReceiver:
    return TorchReceiver(config, ctx, next_)


factory = Factory(type="torch", config_class=Config, create=create,
                  description="PyTorch operator calls (uprobes on libtorch_cpu at::_ops::<op>::call), nested "
                              "per thread", default_on=False)
