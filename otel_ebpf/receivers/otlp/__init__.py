"""OTLP in: gRPC and HTTP servers for OTLP exports (see :mod:`otel_ebpf.receivers.otlp.server`)."""
from __future__ import annotations

from .server import (
    SIGNALS,
    OtlpBindError,
    OtlpServer,
    OtlpServerStats,
    Signal,
    count_items,
    parse_endpoint,
    parse_otlp_json,
    to_otlp_json,
)

__all__ = [
    "SIGNALS",
    "OtlpBindError",
    "OtlpServer",
    "OtlpServerStats",
    "Signal",
    "count_items",
    "parse_endpoint",
    "parse_otlp_json",
    "to_otlp_json",
]
