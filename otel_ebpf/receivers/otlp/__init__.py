"""OTLP receiver: OTLP/gRPC and OTLP/HTTP exports in, one decoded ``Export*ServiceRequest`` per
request out (the gateway's receiver, see :mod:`otel_ebpf.gateway`).

:mod:`.config` (``Config``), :mod:`.receiver` (the component, backpressure), :mod:`.server`
(both transports, stats, OTLP/JSON), :mod:`._http`, :mod:`._status`.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Factory

from .config import Config
from .receiver import Decoding, Offering, OtlpReceiver, create
from .server import (
    SIGNALS,
    Decoded,
    OtlpBindError,
    OtlpServer,
    OtlpServerStats,
    Signal,
    count_items,
    parse_endpoint,
    parse_otlp_json,
    received_bytes,
    to_otlp_json,
)

__all__ = [
    "SIGNALS",
    "Config",
    "Decoded",
    "Decoding",
    "Offering",
    "OtlpBindError",
    "OtlpReceiver",
    "OtlpServer",
    "OtlpServerStats",
    "Signal",
    "count_items",
    "create",
    "factory",
    "parse_endpoint",
    "parse_otlp_json",
    "received_bytes",
    "to_otlp_json",
]

factory = Factory(type="otlp", config_class=Config, create=create,
                  description="OTLP/gRPC and OTLP/HTTP from the agents.")
