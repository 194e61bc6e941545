"""The gateway's ingest: the stage after its OTLP receiver (:mod:`otel_ebpf.receivers.otlp`).
Each decoded export request becomes SDK objects (:mod:`otel_ebpf.emit.otlp_in`): spans and log
records (``ReadableLogRecord``) go to one queue, the pipeline's (its processors pass on what they
do not handle), each request's ``MetricsData`` to another (:class:`Queue`: thread-safe
``offer``, e.g. BoundedQueues).

Trace requests in protobuf are decoded from their bytes without being parsed (:meth:`OtlpIngest.decode_traces`,
which the receiver calls first: the C decoder); what it does not decode is parsed and converted as the rest.

Backpressure: a request is queued whole or not at all. When its queue has no room for all of
it after the receiver's ``wait_for_room``, :meth:`OtlpIngest.offer` returns False and the
receiver refuses the request (UNAVAILABLE / 503 with a ``retry_after`` hint): nothing of it is
kept or counted as received, so the agent's retry duplicates nothing. Refusals count in the
receiver's stats (``refused`` requests) and in ``otel_ebpf.events.refused{receiver, signal}``
(spans / points / log records; signal traces, metrics or logs).

Counted in the gateway's Telemetry once a request is queued: ``otel_ebpf.events.received
{receiver}`` (spans, metric data points and log records converted) and
``otel_ebpf.events.dropped{receiver, reason}`` (``malformed_span``, ``malformed_link``,
``malformed_metric``, ``unsupported_metric_type``, ``malformed_log``). Each queued metrics
request is read by ``losses`` (the agents' drop counters, :mod:`otel_ebpf.gateway.losses`).
Rejected requests (malformed, too large) are counted by the receiver's server. Thread-safe:
called on the receiver's server threads.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_ebpf.core.telemetry import RECEIVED, REFUSED, Telemetry
from otel_ebpf.emit.otlp_in import Drops, logs_from_request, metrics_from_request, spans_from_bytes, spans_from_request
from otel_ebpf.gateway.losses import AgentLossLedger
from otel_ebpf.receivers.otlp import count_items, received_bytes

__all__ = ["DecodedSpans", "OtlpIngest", "Queue"]


class Queue(Protocol):
    def offer(self, events: Sequence[object], *, block_s: float = 0.0) -> bool:
        """Queue ``events`` whole (True) or none of them (False), waiting up to ``block_s``."""


class DecodedSpans:
    """A trace request decoded from its bytes by :meth:`OtlpIngest.decode_traces` (no parse): its spans, what was
    left out of it by reason, and ``items``, the spans it carried (the receiver's server counts them)."""

    __slots__ = ("drops", "items", "spans")

    def __init__(self, spans: list[Any], drops: Drops) -> None:
        self.spans = spans
        self.drops = drops
        self.items = len(spans) + drops.get("malformed_span", 0)


class OtlpIngest:
    """Decoded OTLP requests -> SDK spans and log records (``spans``, the pipeline's queue) and
    MetricsData (``metrics``), counted under ``receiver=name``. ``losses``: reads the agents'
    drop counters from each queued metrics request (optional). Requests of other types are
    ignored."""

    def __init__(self, telemetry: Telemetry, spans: Queue, metrics: Queue, name: str = "otlp",
                 losses: AgentLossLedger | None = None) -> None:
        self.name = name
        self._telemetry = telemetry
        self._spans = spans
        self._metrics = metrics
        self._losses = losses

    def decode_traces(self, raw: bytes) -> DecodedSpans | None:
        """A trace request's spans from its protobuf bytes, unparsed (the C decoder: ~1.2 us a span less than the
        parse and a second read of the parsed request, bench/gateway_wire.py); None for bytes it does not decode,
        which the receiver then parses (and rejects if malformed). Thread-safe (the receiver's server threads)."""
        got = spans_from_bytes(raw)
        return None if got is None else DecodedSpans(*got)

    def offer(self, events: Sequence[object], *, block_s: float = 0.0) -> bool:
        """Queue every request of ``events`` (True), or stop at the first refused (False)."""
        for request in events:
            if type(request) is DecodedSpans:
                if not self._spans_in(request.spans, request.drops, block_s):
                    return False
            elif isinstance(request, ExportTraceServiceRequest):
                if not self._traces(request, block_s):
                    return False
            elif isinstance(request, ExportMetricsServiceRequest):
                if not self._metrics_in(request, block_s):
                    return False
            elif isinstance(request, ExportLogsServiceRequest) and not self._logs_in(request, block_s):
                return False
        return True

    def consume(self, events: Sequence[object]) -> None:
        self.offer(events)

    def _count(self, received: int, drops: Mapping[str, int]) -> None:
        self._telemetry.add(RECEIVED, received, receiver=self.name)
        for reason, n in drops.items():
            self._telemetry.dropped(self.name, reason, n)

    def _traces(self, request: ExportTraceServiceRequest, block_s: float) -> bool:
        # bytes as received: decode_traces (the C decoder) handed them back, so not again; a JSON request has none
        raw = received_bytes(request)
        spans, drops = spans_from_request(request, raw, native=raw is None)
        return self._spans_in(spans, drops, block_s)

    def _spans_in(self, spans: list[Any], drops: Drops, block_s: float) -> bool:
        if not self._spans.offer(spans, block_s=block_s):
            self._telemetry.add(REFUSED, len(spans), receiver=self.name, signal="traces")
            return False
        self._count(len(spans), drops)
        return True

    def _metrics_in(self, request: ExportMetricsServiceRequest, block_s: float) -> bool:
        data, drops = metrics_from_request(request)
        if data.resource_metrics and not self._metrics.offer([data], block_s=block_s):
            self._telemetry.add(REFUSED, count_items(request), receiver=self.name, signal="metrics")
            return False
        self._count(max(0, count_items(request) - sum(drops.values())), drops)
        if self._losses is not None:
            self._losses.observe(request)
        return True

    def _logs_in(self, request: ExportLogsServiceRequest, block_s: float) -> bool:
        logs, drops = logs_from_request(request)
        if not self._spans.offer(logs, block_s=block_s):
            self._telemetry.add(REFUSED, len(logs), receiver=self.name, signal="logs")
            return False
        self._count(len(logs), drops)
        return True
