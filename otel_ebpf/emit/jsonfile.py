"""OTLP JSON lines file exporters, as the OpenTelemetry Collector's file exporter writes them.

Each export call appends one line: an ``ExportTraceServiceRequest``,
``ExportMetricsServiceRequest`` or ``ExportLogsServiceRequest`` in the OTLP/JSON encoding
(protobuf JSON mapping with lowerCamelCase keys, enums as integers, and - unlike plain protobuf
JSON - trace and span ids as hex strings). Metrics are encoded by the SDK's own OTLP encoder,
then protobuf's ``json_format``, only the id spelling adjusted, as the OTLP/JSON specification
requires. Spans and log records, one per call, are written directly by :mod:`.otlp_json`, which
writes the same bytes that path would for ~1/13 of its CPU (``bench/file_export.py``); a batch it
cannot write exactly (an attribute of a type it does not know) goes the SDK's way instead,
counted in the exporter's ``fallbacks`` and logged once.

Files: ``<directory>/traces.jsonl``, ``<directory>/metrics.jsonl`` and ``<directory>/logs.jsonl``.
Thread-safe (a lock per file); an I/O error fails that export (the SDK counts it) and never
raises. Whoever starts the exporters first calls :func:`ensure_writable`, which makes the
directory and the (empty) ``traces.jsonl`` and ``metrics.jsonl``: a wrong ``--output`` is an
error before the job starts rather than retried writes after it, and a job that made no span
still leaves its ``traces.jsonl``. ``logs.jsonl`` is made at its first export (no log records,
no logs file).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_ebpf.core.otlpjson import to_otlp_json
from otel_ebpf.emit.exporter_config import FILES, ensure_writable
from otel_ebpf.emit.otlp_json import Unencodable, logs_to_otlp_json, spans_to_otlp_json
from otel_ebpf.emit.spans import SpanItem, readable_spans

T = TypeVar("T")

__all__ = ["FILES", "JsonLinesLogExporter", "JsonLinesMetricExporter", "JsonLinesSpanExporter", "ensure_writable",
           "to_otlp_json"]

log = logging.getLogger(__name__)


class _LineWriter:
    """Appends lines to one file. Each line is written and flushed to the kernel at once, so an agent that is
    killed loses no line it wrote (the page cache holds it); the file is opened per line, so a file that was
    moved or removed (log rotation) is made again. ``fsync`` runs at most every ``sync_interval_s`` (on the
    first write after it has passed) and at :meth:`sync` (the exporters' flush and shutdown): a host that
    crashes loses at most that much. An fsync after every line held the export thread while the disk wrote
    (8 ranks x 7,500 spans/s: half the spans lost to its full queue, docs/benchmarks.md) and cost it ~0.25 us
    a span (bench/span_stages.py), for durability only a host crash needs; the OpenTelemetry Collector's file
    exporter never fsyncs."""

    def __init__(self, path: Path, sync_interval_s: float = 1.0) -> None:
        self.path = path.absolute()  # BCC changes the working directory while it compiles (deferred start)
        self._lock = threading.Lock()
        self._sync_every = sync_interval_s
        self._synced = time.monotonic()
        self._dirty = False

    def write(self, line: str) -> bool:
        try:
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(line)
                    fh.write("\n")
                    fh.flush()
                    now = time.monotonic()
                    if now - self._synced >= self._sync_every:
                        os.fsync(fh.fileno())
                        self._synced, self._dirty = now, False
                    else:
                        self._dirty = True
            return True
        except OSError as exc:
            log.warning("cannot write %s: %s", self.path, exc)
            return False

    def sync(self) -> bool:
        """``fsync`` what was written since the last one; False (logged) when it failed."""
        try:
            with self._lock:
                if not self._dirty:
                    return True
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self._synced, self._dirty = time.monotonic(), False
            return True
        except OSError as exc:
            log.warning("cannot sync %s: %s", self.path, exc)
            return False


class _Fallbacks:
    """Counts the batches :mod:`.otlp_json` could not write, and logs the first. Thread-safe enough:
    a lost increment under a race miscounts a diagnostic, never the output."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.count = 0

    def encode(self, batch: Sequence[T], direct: Callable[[Sequence[T]], str],
               sdk: Callable[[Sequence[T]], str]) -> str:
        """``batch`` as one OTLP/JSON line: ``direct``'s, or ``sdk``'s when ``direct`` cannot write it exactly."""
        try:
            return direct(batch)
        except Unencodable as exc:
            self.count += 1
            if self.count == 1:
                log.info("%s: a batch the direct OTLP/JSON encoder cannot write exactly (%s); encoded by the SDK "
                         "instead (said once, counted in the exporter's fallbacks)", self.what, exc)
            return sdk(batch)


class JsonLinesSpanExporter(SpanExporter):
    """Takes span items as well as SDK spans (``takes_span_items``: the emitter hands it its queue's batches as
    they are, otel_ebpf.emit.spans)."""

    takes_span_items = True

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._writer = _LineWriter(Path(directory) / FILES[0])
        self._fallback = _Fallbacks("traces.jsonl")

    @property
    def fallbacks(self) -> int:
        """Batches encoded the SDK's way because :mod:`.otlp_json` could not write them exactly."""
        return self._fallback.count

    def export(self, spans: Sequence[ReadableSpan | SpanItem]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        line = self._fallback.encode(spans, spans_to_otlp_json, lambda b: to_otlp_json(encode_spans(readable_spans(b))))
        ok = self._writer.write(line)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._writer.sync()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._writer.sync()


class JsonLinesMetricExporter(MetricExporter):
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})
        self._writer = _LineWriter(Path(directory) / FILES[1])

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        if not metrics_data.resource_metrics:
            return MetricExportResult.SUCCESS
        ok = self._writer.write(to_otlp_json(encode_metrics(metrics_data)))
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._writer.sync()

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._writer.sync()


class JsonLinesLogExporter(LogRecordExporter):
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._writer = _LineWriter(Path(directory) / FILES[2])
        self._fallback = _Fallbacks("logs.jsonl")

    @property
    def fallbacks(self) -> int:
        """Batches encoded the SDK's way because :mod:`.otlp_json` could not write them exactly."""
        return self._fallback.count

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        if not batch:
            return LogRecordExportResult.SUCCESS
        line = self._fallback.encode(batch, logs_to_otlp_json, lambda b: to_otlp_json(encode_logs(b)))
        ok = self._writer.write(line)
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def shutdown(self) -> None:
        self._writer.sync()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._writer.sync()
