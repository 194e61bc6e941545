"""CUDA runtime receiver: uprobes on libcudart.so -> typed events (:mod:`.events`).

Probed (per-thread-default-stream ``_ptsz``/``_ptds`` twins too, where the library has them):
cudaLaunchKernel, cudaLaunchKernelExC (entry only, counted in the kernel), cudaMemcpy,
cudaMemcpyAsync, cudaMalloc, cudaMallocAsync, cudaMallocManaged, cudaFree, cudaFreeAsync,
cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cudaSetDevice.
The ``cuda`` processor turns the events into spans and metrics.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import CudaReceiver

__all__ = ["Config", "CudaReceiver", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> CudaReceiver:
    return CudaReceiver(config, ctx, next_)


factory = Factory(type="cuda", config_class=Config, create=create,
                  description="CUDA runtime API calls (libcudart uprobes): memcpy, malloc/free, "
                              "synchronize, device binding, kernel launch counts")
