"""CUDA processor: CUDA runtime events -> spans and metrics (see :mod:`.processor`)."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .errors import error_name
from .processor import CudaProcessor

__all__ = ["Config", "CudaProcessor", "create", "error_name", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> CudaProcessor:
    return CudaProcessor(config, ctx, next_)


factory = Factory(type="cuda", config_class=Config, create=create,
                  description="CUDA runtime events to spans (memcpy, malloc/free, synchronize) and "
                              "gpu.cuda.* metrics (launches, copies, outstanding and leaked memory)")
