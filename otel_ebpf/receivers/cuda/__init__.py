"""CUDA receiver: uprobes on libcudart.so (the runtime) and libcuda.so (the driver) -> typed events
(:mod:`.events`).

Probed (per-thread-default-stream ``_ptsz``/``_ptds`` twins too, where the library has them), on the
runtime: cudaLaunchKernel, cudaLaunchKernelExC (entry only, counted in the kernel), cudaMemcpy,
cudaMemcpyAsync, cudaMalloc, cudaMallocAsync, cudaMallocManaged, cudaFree, cudaFreeAsync,
cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cudaSetDevice, cudaGraphLaunch;
counted only: cudaMemset*, cudaEventRecord*, cudaStreamWaitEvent, cudaStreamCreate*/Destroy,
cudaEventCreate*/Destroy, cudaHostRegister/Unregister. On the driver: cuLaunchKernel, cuLaunchKernelEx
(counted once when the runtime made them), cuGraphLaunch. The ``cuda`` processor turns the events into
spans and metrics.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import CudaReceiver

__all__ = ["Config", "CudaReceiver", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> CudaReceiver:
    return CudaReceiver(config, ctx, next_)


factory = Factory(type="cuda", config_class=Config, create=create,
                  description="CUDA runtime and driver API calls (libcudart, libcuda uprobes): memcpy, "
                              "malloc/free, synchronize, device binding, events and streams, kernel launch "
                              "and graph replay counts")
