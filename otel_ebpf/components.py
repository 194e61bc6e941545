"""The registries: every component type, listed by hand (nothing registers itself on import).

After the OTel Collector's ``components.go``. Adding a component means adding one line here.
"""
from __future__ import annotations

from otel_ebpf.pipeline import Factory

__all__ = ["processors", "receivers"]


def receivers() -> dict[str, Factory]:
    from otel_ebpf.receivers import cuda, nccl, nvml

    return {f.type: f for f in (cuda.factory, nccl.factory, nvml.factory)}


def processors() -> dict[str, Factory]:
    from otel_ebpf.processors import cuda, nccl

    return {f.type: f for f in (cuda.factory, nccl.factory)}
