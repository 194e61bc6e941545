"""NVML receiver: NVIDIA GPU metrics from the driver's management library, no eBPF involved.

Scrapes every GPU every ``interval`` through pynvml (nvidia-ml-py): utilization, memory, temperature,
power, fan, clocks, encoder/decoder, PCIe, ECC, clock throttle reasons, NVLink, MIG, and per-process
memory and utilization (on each process's own resource, beside its eBPF spans); XID errors arrive
through NVML's event API. Emits :class:`~otel_ebpf.core.events.MetricRecord` s directly (the ``cuda`` and
``nccl`` processors pass them on unchanged). Names: :mod:`.metrics` and docs/nvml.md.
Without NVML on the host it logs one line and stays idle: INFO where the PCI bus shows no
NVIDIA GPU (:mod:`.presence`), a warning where it does.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import Config
from .receiver import NvmlReceiver

__all__ = ["Config", "NvmlReceiver", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> NvmlReceiver:
    return NvmlReceiver(config, ctx, next_)


factory = Factory(type="nvml", config_class=Config, create=create,
                  description="NVIDIA GPU metrics and XID errors from NVML (pynvml), per GPU and per process")
