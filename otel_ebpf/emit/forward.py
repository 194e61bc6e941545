"""The gateway's emit stage: spans, metrics and log records received from agents go out through
the SDK.

* SDK ``ReadableSpan`` (received, joined or synthesized) -> every exporter's span queue (the
  :class:`~otel_ebpf.emit.emitter.Emitter`'s: bounded, own worker, batching, retries; drops
  counted in ``otel_ebpf.events.dropped{receiver=<exporter>}``).
* SDK ``ReadableLogRecord`` (received) -> every exporter's log queue (the Emitter's; none for
  Prometheus), drops counted in ``otel_ebpf.events.dropped{receiver=<exporter>, signal=logs}``.
* SDK ``MetricsData`` (received from agents) -> every exporter's metric queue, as is; drops are
  counted in ``otel_ebpf.metrics.dropped``, failed attempts in ``otel_ebpf.export.failed``.
* Anything else (the gateway's own ``MetricRecord`` and ``LogRecord``, e.g. the collective join's desync and
  straggler records, ``Tick``) -> the Emitter.

Thread safety: ``consume`` may be called from several pipeline workers at once (the trace and
the metrics queue). It never waits for an exporter: one slow exporter delays no other.
``spans_forwarded`` / ``logs_forwarded``: what it put on the queues so far (log records received and the
gateway's own).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.core.events import LogRecord
from otel_ebpf.core.telemetry import Telemetry
from otel_ebpf.emit.emitter import Emitter, ExporterSpec

__all__ = ["Forwarder"]

log = logging.getLogger(__name__)


class Forwarder:
    """Consumer at the end of the gateway pipeline; passes nothing on.

    ``start``/``shutdown`` drive the Emitter (shutdown flushes every span and metric)."""

    def __init__(self, emitter: Emitter, exporters: Sequence[ExporterSpec], telemetry: Telemetry) -> None:
        """``exporters`` and ``telemetry``: those the Emitter was built with (kept for callers;
        the Emitter's queues do the sending)."""
        self.emitter = emitter
        self._exporters = list(exporters)
        self._telemetry = telemetry
        self._lock = threading.Lock()
        self.spans_forwarded = 0
        self.logs_forwarded = 0

    def consume(self, events: Sequence[object]) -> None:
        others: list[object] = []
        spans: list[ReadableSpan] = []
        logs: list[ReadableLogRecord] = []
        own_logs = 0
        for ev in events:
            if isinstance(ev, ReadableSpan):
                spans.append(ev)
            elif isinstance(ev, ReadableLogRecord):
                logs.append(ev)
            elif isinstance(ev, MetricsData):
                self.emitter.export_metrics_data(ev)
            else:
                own_logs += isinstance(ev, LogRecord)
                others.append(ev)
        self.emitter.export_spans(spans)
        self.emitter.export_logs(logs)
        with self._lock:
            self.spans_forwarded += len(spans)
            self.logs_forwarded += len(logs) + own_logs
        if others:
            self.emitter.consume(others)

    def flush(self, timeout_s: float = 30.0) -> None:
        self.emitter.flush(timeout_s)

    def start(self) -> None:
        self.emitter.start()

    def shutdown(self) -> None:
        self.emitter.shutdown()
