"""The gateway's registries, listed by hand (the agent's are in :mod:`otel_ebpf.service.components`;
the gateway's processors are not offered to the agent and the other way round)."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

__all__ = ["processors", "receiver_factories", "receivers"]


def receiver_factories() -> dict[str, Factory]:
    """Receiver type -> its factory (the service builds its receivers through these)."""
    from otel_ebpf.receivers import otlp

    return {f.type: f for f in (otlp.factory,)}


def receivers() -> dict[str, type]:
    """Receiver type -> its Config class, for :mod:`otel_ebpf.gateway.config`, which reads
    config classes here. Once it reads ``f.config_class`` of :func:`receiver_factories`
    instead, this returns the factories (like :func:`processors`)."""
    return {t: f.config_class for t, f in receiver_factories().items()}


def processors() -> dict[str, Factory]:
    from otel_ebpf.processors import collective_join

    return {f.type: f for f in (collective_join.factory,)}
