"""The gateway's OTLP receiver: an :class:`~otel_ebpf.receivers.otlp.OtlpServer` whose requests
become SDK objects (:mod:`otel_ebpf.emit.otlp_in`): spans go to one queue, each request's
``MetricsData`` to another (:class:`Queue`: thread-safe ``offer``, e.g. BoundedQueues).

Backpressure: a request is queued whole or not at all. When its queue has no room for all of
it after ``wait_for_room``, the request is refused (UNAVAILABLE / 503 with a ``retry_after``
hint, see :class:`~otel_ebpf.receivers.otlp.OtlpServer`): nothing of it is kept or counted as
received, so the agent's retry duplicates nothing. Refusals count in the server's stats
(``refused`` requests) and in ``otel_ebpf.events.refused{receiver, signal}`` (spans / points).

Counted in the gateway's Telemetry once a request is queued: ``otel_ebpf.events.received
{receiver}`` (spans and metric data points converted) and ``otel_ebpf.events.dropped{receiver,
reason}`` (``malformed_span``, ``malformed_link``, ``malformed_metric``,
``unsupported_metric_type``). Each queued metrics request is read by ``losses`` (the agents'
drop counters, :mod:`otel_ebpf.gateway.losses`). Rejected requests (malformed, too large) are
counted by the server (:attr:`stats`). Logs are not accepted (UNIMPLEMENTED / 404). ``start``
raises OtlpBindError naming the endpoint.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from otel_ebpf.core.config import doc
from otel_ebpf.emit.otlp_in import metrics_from_request, spans_from_request
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.gateway.losses import AgentLossLedger
from otel_ebpf.core.pipeline import Context
from otel_ebpf.receivers.otlp.server import OtlpServer, OtlpServerStats, count_items, parse_endpoint
from otel_ebpf.core.telemetry import RECEIVED, REFUSED

__all__ = ["OtlpInReceiver", "OtlpReceiverConfig", "Queue"]

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
    wait_for_room: float = doc(0.1, "How long a request waits for room in a full gateway queue (holding one "
                                    "server thread) before it is refused whole: UNAVAILABLE / 503, counted in "
                                    "otel_ebpf.events.refused; the agent retries it. 0: refuse at once.",
                               duration=True)
    retry_after: float = doc(1.0, "Retry hint sent with a refusal: google.rpc.RetryInfo (gRPC) and "
                                  "Retry-After in whole seconds, rounded up (HTTP). The SDK's OTLP exporters "
                                  "wait that long before retrying, within their own timeout.", duration=True)

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
        if self.wait_for_room > 10:
            raise ConfigError(f"{path}.wait_for_room", f"must be <= 10s (it holds a server thread), "
                                                        f"got {self.wait_for_room}s")
        if not 0.001 <= self.retry_after <= 3600:
            raise ConfigError(f"{path}.retry_after", f"must be between 1ms and 1h, got {self.retry_after}s")


class Queue(Protocol):
    def offer(self, events: Sequence[object], *, block_s: float = 0.0) -> bool:
        """Queue ``events`` whole (True) or none of them (False), waiting up to ``block_s``."""


class OtlpInReceiver:
    """OTLP in -> SDK spans and MetricsData. Callbacks run on server threads; ``start`` and
    ``shutdown`` follow the component contract (shutdown safe without start and twice).
    ``losses``: reads the agents' drop counters from each queued metrics request (optional)."""

    def __init__(self, config: OtlpReceiverConfig, ctx: Context, spans: Queue, metrics: Queue,
                 name: str = "otlp", losses: AgentLossLedger | None = None) -> None:
        self.name = name
        self._telemetry = ctx.telemetry
        self._spans = spans
        self._metrics = metrics
        self._wait = config.wait_for_room
        self._losses = losses
        self.server = OtlpServer(grpc_endpoint=config.grpc_endpoint or None,
                                 http_endpoint=config.http_endpoint or None, on_traces=self._on_traces,
                                 on_metrics=self._on_metrics, max_request_bytes=config.max_request_bytes,
                                 max_workers=config.max_workers, retry_after=config.retry_after)
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

    def _on_traces(self, request: Any) -> bool:
        spans, drops = spans_from_request(request)
        if not self._spans.offer(spans, block_s=self._wait):
            self._telemetry.add(REFUSED, len(spans), receiver=self.name, signal="traces")
            return False
        self._count(len(spans), drops)
        return True

    def _on_metrics(self, request: Any) -> bool:
        data, drops = metrics_from_request(request)
        if data.resource_metrics and not self._metrics.offer([data], block_s=self._wait):
            self._telemetry.add(REFUSED, count_items(request), receiver=self.name, signal="metrics")
            return False
        self._count(max(0, count_items(request) - sum(drops.values())), drops)
        if self._losses is not None:
            self._losses.observe(request)
        return True

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.server.start()

    def shutdown(self) -> None:
        self.server.shutdown()
