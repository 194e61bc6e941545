"""The gateway's registries, listed by hand (the agent's are in :mod:`otel_ebpf.service.components`;
the gateway's processors are not offered to the agent and the other way round)."""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

__all__ = ["processors", "receivers"]


def receivers() -> dict[str, Factory]:
    """Receiver type -> its factory (config class, default and component)."""
    from otel_ebpf.receivers import otlp

    return {f.type: f for f in (otlp.factory,)}


def processors() -> dict[str, Factory]:
    from otel_ebpf.processors import collective_join

    return {f.type: f for f in (collective_join.factory,)}
