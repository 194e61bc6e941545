"""The gateway's registries, listed by hand (the agent's are in :mod:`otel_ebpf.service.components`;
the gateway's processors are not offered to the agent and the other way round)."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

__all__ = ["processors", "receivers"]


def receivers() -> dict[str, type]:
    """Receiver type -> its Config class (the service builds the one receiver kind itself)."""
    from otel_ebpf.gateway.receiver import OtlpReceiverConfig

    return {"otlp": OtlpReceiverConfig}


def processors() -> dict[str, Factory]:
    from otel_ebpf.processors import collective_join

    return {f.type: f for f in (collective_join.factory,)}
