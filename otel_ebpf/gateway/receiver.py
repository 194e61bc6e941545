"""The gateway's OTLP receiver: an :class:`~otel_ebpf.receivers.otlp.OtlpServer` whose requests
become SDK objects (:mod:`otel_ebpf.emit.otlp_in`): spans go to one consumer, each request's
``MetricsData`` to another (both must be thread-safe and non-blocking, e.g. BoundedQueues).

Counted in the gateway's Telemetry: ``otel_ebpf.events.received{receiver}`` (spans and
metric data points converted) and ``otel_ebpf.events.dropped{receiver, reason}``
(``malformed_span``, ``malformed_link``, ``malformed_metric``, ``unsupported_metric_type``).
Rejected requests (malformed, too large) are counted by the server (:attr:`stats`). Logs are
not accepted (UNIMPLEMENTED / 404). ``start`` raises OtlpBindError naming the endpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from otel_ebpf.config import doc
from otel_ebpf.emit.otlp_in import metrics_from_request, spans_from_request
from otel_ebpf.errors import ConfigError
from otel_ebpf.pipeline import Consumer, Context
from otel_ebpf.receivers.otlp.server import OtlpServer, OtlpServerStats, count_items, parse_endpoint
from otel_ebpf.telemetry import RECEIVED

__all__ = ["OtlpInReceiver", "OtlpReceiverConfig"]

_MIB = 1024 * 1024


@dataclass
class OtlpReceiverConfig:
    grpc_endpoint: str = doc("127.0.0.1:4327", "OTLP/gRPC listen address HOST:PORT (port 0: any free port; "
                                               "empty: off). Loopback unless set; 4327/4328 leave 4317/4318 "
                                               "to a Collector on the same host.")
    http_endpoint: str = doc("127.0.0.1:4328", "OTLP/HTTP listen address HOST:PORT (POST /v1/traces, "
                                               "/v1/metrics); empty: off.")
    max_request_bytes: int = doc(16 * _MIB, "Largest export request accepted once decompressed; larger ones "
                                            "are refused (RESOURCE_EXHAUSTED / 413) and counted.")
    max_workers: int = doc(8, "Server threads per transport (each handles one request at a time).")

    def validate(self, path: str) -> None:
        for key in ("grpc_endpoint", "http_endpoint"):
            value = getattr(self, key)
            if value:
                parse_endpoint(value, what=f"{path}.{key}")
        if not (self.grpc_endpoint or self.http_endpoint):
            raise ConfigError(path, "enable grpc_endpoint or http_endpoint (both are empty)")
        for key in ("max_request_bytes", "max_workers"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{path}.{key}", f"must be >= 1, got {getattr(self, key)}")



class OtlpInReceiver:
    """OTLP in -> SDK spans and MetricsData. Callbacks run on server threads; ``start`` and
    ``shutdown`` follow the component contract (shutdown safe without start and twice)."""

    def __init__(self, config: OtlpReceiverConfig, ctx: Context, spans: Consumer, metrics: Consumer,
                 name: str = "otlp") -> None:
        self.name = name
        self._telemetry = ctx.telemetry
        self._spans = spans
        self._metrics = metrics
        self.server = OtlpServer(grpc_endpoint=config.grpc_endpoint or None,
                                 http_endpoint=config.http_endpoint or None, on_traces=self._on_traces,
                                 on_metrics=self._on_metrics, max_request_bytes=config.max_request_bytes,
                                 max_workers=config.max_workers)
        self._started = False

    @property
    def stats(self) -> OtlpServerStats:
        return self.server.stats

    @property
    def grpc_port(self) -> int:
        return self.server.grpc_port

    @property
    def http_port(self) -> int:
        return self.server.http_port

    def _count(self, received: int, drops: Any) -> None:
        self._telemetry.add(RECEIVED, received, receiver=self.name)
        for reason, n in drops.items():
            self._telemetry.dropped(self.name, reason, n)

    def _on_traces(self, request: Any) -> None:
        spans, drops = spans_from_request(request)
        self._count(len(spans), drops)
        if spans:
            self._spans.consume(spans)

    def _on_metrics(self, request: Any) -> None:
        data, drops = metrics_from_request(request)
        self._count(max(0, count_items(request) - sum(drops.values())), drops)
        if data.resource_metrics:
            self._metrics.consume([data])

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.server.start()

    def shutdown(self) -> None:
        self.server.shutdown()
