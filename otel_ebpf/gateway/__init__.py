"""The gateway (``otel-ebpf gateway``): receives OTLP from every node's agent, joins each NCCL
collective's rank spans into one trace (``collective_join``), and exports through the SDK.

:mod:`.config` (GatewayConfig, ``load``), :mod:`.components` (its registries: the receiver is
:mod:`otel_ebpf.receivers.otlp`), :mod:`.ingest` (received requests -> SDK objects, queued),
:mod:`.service` (the running pipeline). Several gateways scale
out behind a Collector ``loadbalancing`` exporter routing by trace id
(``deploy/otelcol-gateway-loadbalancing.yaml``).
"""
from __future__ import annotations

from .config import GatewayConfig, load
from .service import Gateway

__all__ = ["Gateway", "GatewayConfig", "load"]
