"""The gateway's emit stage: spans and metrics received from agents go out through the SDK.

* SDK ``ReadableSpan`` (received, joined or synthesized) -> ``on_end`` of every exporter's SDK
  ``BatchSpanProcessor`` (the :class:`~otel_ebpf.emit.emitter.Emitter`'s, so each exporter has
  one bounded batch queue; drops are counted by the SDK's ``otel.sdk.processor.span.processed``).
* SDK ``MetricsData`` (received from agents) -> ``export`` of every exporter's SDK metric
  exporter, as is; a failed export is counted in ``otel_ebpf.export.failed{signal=metrics}``.
* Anything else (the gateway's own ``MetricRecord``, ``Tick``) -> the Emitter.

Thread safety: ``consume`` may be called from several pipeline workers at once (the trace and
the metrics queue); span hand-off is thread-safe in the SDK, metric exports are serialised
by a lock. It blocks for as long as a metric export takes (the exporter's timeout).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.emit.emitter import Emitter, ExporterSpec, export_metrics_to
from otel_ebpf.telemetry import Telemetry

__all__ = ["Forwarder"]

log = logging.getLogger(__name__)


class Forwarder:
    """Consumer at the end of the gateway pipeline; passes nothing on.

    ``start``/``shutdown`` drive the Emitter (shutdown flushes every span and metric)."""

    def __init__(self, emitter: Emitter, exporters: Sequence[ExporterSpec], telemetry: Telemetry) -> None:
        self.emitter = emitter
        self._exporters = list(exporters)
        self._telemetry = telemetry
        self._lock = threading.Lock()
        self.spans_forwarded = 0

    def consume(self, events: Sequence[object]) -> None:
        others: list[object] = []
        processors = self.emitter.span_processors
        spans = 0
        for ev in events:
            if isinstance(ev, ReadableSpan):
                for sp in processors:
                    sp.on_end(ev)
                spans += 1
            elif isinstance(ev, MetricsData):
                self._export_metrics(ev)
            else:
                others.append(ev)
        with self._lock:
            self.spans_forwarded += spans
        if others:
            self.emitter.consume(others)

    def _export_metrics(self, data: MetricsData) -> None:
        with self._lock:
            export_metrics_to(self._exporters, data, self._telemetry)

    def flush(self, timeout_s: float = 30.0) -> None:
        self.emitter.flush(timeout_s)

    def start(self) -> None:
        self.emitter.start()

    def shutdown(self) -> None:
        self.emitter.shutdown()
