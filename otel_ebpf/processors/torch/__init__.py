"""PyTorch processor: operator calls and steps (otel_ebpf/receivers/torch) to nested spans, one trace per
step under a pytorch.step span, and the pytorch.op.duration / pytorch.step.duration histograms."""
from __future__ import annotations

from otel_ebpf.core.ids import op_ids
from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .processor import TorchProcessor

__all__ = ["Config", "TorchProcessor", "create", "factory", "op_ids"]


def create(config: Config, ctx: Context, next_: Consumer) -> TorchProcessor:
    return TorchProcessor(config, ctx, next_)


factory = Factory(type="torch", config_class=Config, create=create,
                  description="PyTorch operator calls to nested spans (one trace per step) and the "
                              "pytorch.op.duration and pytorch.step.duration histograms",
                  default_on=False)
