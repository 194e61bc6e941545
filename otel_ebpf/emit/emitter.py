"""The emit stage: the only place where records become OTel SDK spans and metrics.

Each traced process is its own OTel ``Resource`` (``process.pid``, executable, container...)
with its own ``MeterProvider``. Spans arrive finished, with known times and (sometimes derived)
ids, so they are built directly as the SDK's ``ReadableSpan`` (1.8 µs each, against ~13 µs
through ``Tracer.start_span``, whose sampler and context machinery have nothing to decide
here) and handed to one SDK ``BatchSpanProcessor`` per exporter (spans carry their resource;
the OTLP encoder groups them). Each MeterProvider has a pull reader; one timer thread collects them all every
``metrics_interval``, adds the weighted histograms, and hands a single merged ``MetricsData``
to every metric exporter.

Bounds: at most ``max_processes`` providers. When a process exits (ProcessExit) its metrics
are exported until ``exit_grace`` has passed (late in-kernel aggregates still find it), then its
provider is released; when the limit is hit, the least recently
used process is flushed the same way and the eviction counted
(``otel_ebpf.events.dropped{reason=process_evicted}`` counts nothing lost, only state freed:
see ``otel_ebpf.processes.evicted``).

Threading: ``consume`` runs on the pipeline worker, collection on the timer thread; one lock
guards the provider table. ``shutdown`` exports the last metrics and flushes all spans.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from otel_ebpf.emit.histograms import HistogramStore
from otel_ebpf.events import MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.telemetry import Telemetry

__all__ = ["Emitter", "ExporterSpec", "export_metrics_to"]

log = logging.getLogger(__name__)
_MAX_PENDING_SERIES = 4096  # counter series summed per process between collections
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER,
          "producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER}


@dataclass
class ExporterSpec:
    """One configured exporter: its id, SDK exporters and span batching."""

    name: str
    spans: SpanExporter
    metrics: MetricExporter
    queue_size: int = 8192
    batch_size: int = 512
    batch_delay: float = 1.0


_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_OK = Status(StatusCode.UNSET)


@dataclass
class _Proc:
    meters: MeterProvider
    reader: InMemoryMetricReader
    resource: Resource
    histograms: HistogramStore = field(default_factory=lambda: HistogramStore(2048))
    instruments: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    # counter/updown deltas summed per series until the next collection: the SDK's add() costs
    # ~15 us (a Measurement, attribute cleaning and hashing), paid once per series per interval
    pending: dict[tuple[Any, ...], list[Any]] = field(default_factory=dict)
    exited_ns: int | None = None

    def flush_pending(self) -> None:
        for inst, attrs, total in self.pending.values():
            inst.add(total, attrs)
        self.pending.clear()


def _wait_for_room(sp: BatchSpanProcessor, wait_s: float) -> bool:
    """Backpressure: wait (bounded) while the SDK batch queue is full, so a slow exporter slows
    the pipeline, and through it the ring buffer (where overflow is counted), instead of the SDK
    silently evicting the oldest queued span. False: still full after ``wait_s``.

    Reads the SDK's queue (opentelemetry-sdk 1.45: ``_batch_processor._queue`` and
    ``_max_queue_size``); if those names change this degrades to no backpressure, and the SDK
    still counts its drops in ``otel.sdk.processor.span.processed{error.type}``.
    """
    bp = getattr(sp, "_batch_processor", None)
    queue, limit = getattr(bp, "_queue", None), getattr(bp, "_max_queue_size", None)
    if queue is None or not isinstance(limit, int) or len(queue) < limit:
        return True
    deadline = time.monotonic() + wait_s
    while len(queue) >= limit:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


class _CountingSpanExporter(SpanExporter):
    """Counts the spans of every batch its exporter could not send: the SDK's BatchSpanProcessor
    ignores export results (opentelemetry-sdk 1.45), so without this a batch given up after the
    OTLP exporter's retries (collector down longer than ``timeout``) would vanish uncounted.
    Counted as ``otel_ebpf.events.dropped{receiver=<exporter>, reason=export_failed}``."""

    def __init__(self, inner: SpanExporter, telemetry: Telemetry, name: str) -> None:
        self._inner, self._telemetry, self._name = inner, telemetry, name

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception:
            log.warning("span export to %s failed", self._name, exc_info=True)
            result = SpanExportResult.FAILURE
        if result != SpanExportResult.SUCCESS:
            self._telemetry.dropped(self._name, "export_failed", len(spans))
            self._telemetry.add("otel_ebpf.export.failed", 1, signal="spans", exporter=self._name)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


def export_metrics_to(exporters: Sequence[ExporterSpec], data: MetricsData, telemetry: Telemetry) -> None:
    """Hand ``data`` to every exporter's SDK metric exporter; a failure (result or exception)
    is logged and counted in ``otel_ebpf.export.failed{signal=metrics}``, never raised."""
    if not data.resource_metrics:
        return
    for spec in exporters:
        try:
            result = spec.metrics.export(data, timeout_millis=10_000)
        except Exception:
            log.warning("metric export to %s failed", spec.name, exc_info=True)
            result = MetricExportResult.FAILURE
        if result != MetricExportResult.SUCCESS:
            telemetry.add("otel_ebpf.export.failed", 1, signal="metrics", exporter=spec.name)


class Emitter:
    """Consumer of SpanRecord, MetricRecord and ProcessExit; passes nothing on."""

    def __init__(self, exporters: Sequence[ExporterSpec], telemetry: Telemetry, *,
                 resource_of: Callable[[int, str | None], Mapping[str, Any]],
                 agent_attributes: Mapping[str, Any], extra_attributes: Mapping[str, str] | None = None,
                 max_processes: int = 1024, metrics_interval: float = 10.0, exit_grace: float = 5.0) -> None:
        self._exporters = list(exporters)
        self._telemetry = telemetry
        self._resource_of = resource_of
        self._extra = dict(extra_attributes or {})
        self._max = max_processes
        self._interval = metrics_interval
        self._grace_ns = int(exit_grace * 1e9)
        self._export_wait_s = 2.0
        self._lock = threading.RLock()
        self._procs: OrderedDict[int, _Proc] = OrderedDict()
        self._retired: list[ResourceMetrics] = []
        self._ids = RandomIdGenerator()
        self._scopes: dict[str, InstrumentationScope] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shut = False
        self._agent = self._make_proc(Resource.create(dict(agent_attributes)))
        self.span_processors = [
            BatchSpanProcessor(_CountingSpanExporter(e.spans, telemetry, e.name), max_queue_size=e.queue_size,
                               max_export_batch_size=e.batch_size, schedule_delay_millis=e.batch_delay * 1000,
                               meter_provider=self._agent.meters)
            for e in self._exporters]
        self._observed: set[str] = set()
        self.spans_emitted = 0

    # ---- providers -------------------------------------------------------------------
    def _make_proc(self, resource: Resource) -> _Proc:
        reader = InMemoryMetricReader()
        meters = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        return _Proc(meters, reader, resource)

    def _proc(self, pid: int | None, comm: str | None) -> _Proc:
        if pid is None:
            return self._agent
        proc = self._procs.get(pid)
        if proc is not None:
            self._procs.move_to_end(pid)
            return proc
        if len(self._procs) >= self._max:
            _old_pid, old = self._procs.popitem(last=False)
            self._retire(old)
            self._telemetry.add("otel_ebpf.processes.evicted", 1)
        attrs = dict(self._resource_of(pid, comm))
        attrs.update(self._extra)
        proc = self._make_proc(Resource.create(attrs))
        self._procs[pid] = proc
        return proc

    def _retire(self, proc: _Proc) -> None:
        """Keep a process's final metrics for the next export, then let it go."""
        rm = self._collect_proc(proc, time.time_ns())
        if rm is not None:
            self._retired.append(rm)

    # ---- consume ---------------------------------------------------------------------
    def consume(self, events: Sequence[object]) -> None:
        with self._lock:
            for ev in events:
                try:
                    if isinstance(ev, SpanRecord):
                        self._span(ev)
                    elif isinstance(ev, MetricRecord):
                        self._metric(ev)
                    elif isinstance(ev, ProcessExit):
                        proc = self._procs.get(ev.pid)
                        if proc is not None and proc.exited_ns is None:
                            proc.exited_ns = time.time_ns()
                except Exception:  # a bad record must not stop the others
                    log.debug("cannot emit %r", ev, exc_info=True)
                    self._telemetry.dropped("emit", "bad_record")

    def _span(self, rec: SpanRecord) -> None:
        proc = self._proc(rec.pid, rec.comm)
        trace_id = rec.trace_id or self._ids.generate_trace_id()
        parent = (SpanContext(trace_id, rec.parent_span_id, is_remote=True, trace_flags=_SAMPLED)
                  if rec.parent_span_id is not None else None)
        scope = self._scopes.get(rec.scope)
        if scope is None:
            scope = self._scopes[rec.scope] = InstrumentationScope(rec.scope)
        span = ReadableSpan(
            name=rec.name,
            context=SpanContext(trace_id, rec.span_id or self._ids.generate_span_id(), is_remote=False,
                                trace_flags=_SAMPLED),
            parent=parent, resource=proc.resource, attributes=rec.attributes,
            events=[Event(e.name, e.attributes, e.time_ns) for e in rec.events],
            links=[Link(SpanContext(lk.trace_id, lk.span_id, is_remote=True, trace_flags=_SAMPLED),
                        lk.attributes) for lk in rec.links],
            kind=_KINDS[rec.kind], status=_OK if rec.error is None else Status(StatusCode.ERROR, rec.error),
            start_time=rec.start_ns, end_time=max(rec.end_ns, rec.start_ns), instrumentation_scope=scope)
        for spec, sp in zip(self._exporters, self.span_processors, strict=True):
            if _wait_for_room(sp, self._export_wait_s):
                sp.on_end(span)
            else:
                self._telemetry.dropped(spec.name, "export_queue_full")
        self.spans_emitted += 1

    def _metric(self, rec: MetricRecord) -> None:
        proc = self._proc(rec.pid, rec.comm)
        if rec.kind == "histogram":
            if not proc.histograms.record(rec.scope, rec.name, rec.unit, rec.description,
                                          rec.attributes, rec.value, rec.count, time.time_ns(), rec.buckets):
                self._telemetry.dropped("emit", "histogram_series_limit")
            return
        key = (rec.scope, rec.name, rec.kind)
        inst = proc.instruments.get(key)
        if inst is None:
            meter = proc.meters.get_meter(rec.scope)
            make: Callable[..., Any] = {"counter": meter.create_counter, "updown": meter.create_up_down_counter,
                                        "gauge": meter.create_gauge}[rec.kind]
            inst = proc.instruments[key] = make(rec.name, unit=rec.unit, description=rec.description)
        if rec.kind == "gauge":
            inst.set(rec.value, dict(rec.attributes))
            return
        series = (key, *rec.attributes.items())
        slot = proc.pending.get(series)
        if slot is None:
            if len(proc.pending) >= _MAX_PENDING_SERIES:  # bounded: hand the sums to the SDK now
                proc.flush_pending()
            proc.pending[series] = [inst, dict(rec.attributes), rec.value * rec.count]
        else:
            slot[2] += rec.value * rec.count

    # ---- metrics collection ----------------------------------------------------------
    def _observe(self, name: str) -> Callable[[CallbackOptions], list[Observation]]:
        def callback(_: CallbackOptions) -> list[Observation]:
            return [Observation(v, a) for n, a, v in self._telemetry.snapshot() if n == name]
        return callback

    def _register_telemetry(self) -> None:
        meter = self._agent.meters.get_meter("otel_ebpf.agent")
        for name, _attrs, _v in self._telemetry.snapshot():
            if name not in self._observed:
                self._observed.add(name)
                meter.create_observable_counter(name, [self._observe(name)], unit="1",
                                                description=Telemetry.description(name))

    def _collect_proc(self, proc: _Proc, now_ns: int) -> ResourceMetrics | None:
        proc.flush_pending()
        scopes: dict[str, list[Any]] = {}
        data = proc.reader.get_metrics_data()
        for rm in (data.resource_metrics if data else ()):
            for sm in rm.scope_metrics:
                scopes.setdefault(sm.scope.name, []).extend(sm.metrics)
        for scope, metrics in proc.histograms.collect(now_ns).items():
            scopes.setdefault(scope, []).extend(metrics)
        if not scopes:
            return None
        return ResourceMetrics(proc.resource, [ScopeMetrics(InstrumentationScope(s), m, "")
                                               for s, m in scopes.items()], "")

    def collect(self) -> MetricsData:
        """Collect every process's metrics (and release exited ones) into one MetricsData."""
        now = time.time_ns()
        with self._lock:
            self._register_telemetry()
            out, self._retired = self._retired, []
            for pid in list(self._procs):
                proc = self._procs[pid]
                rm = self._collect_proc(proc, now)
                if rm is not None:
                    out.append(rm)
                # Released only after a grace period: in-kernel aggregates (launch counts) of a
                # process are read up to one stats interval after it exited.
                if proc.exited_ns is not None and now - proc.exited_ns >= self._grace_ns:
                    del self._procs[pid]
            agent = self._collect_proc(self._agent, now)
            if agent is not None:
                out.append(agent)
        return MetricsData(resource_metrics=out)

    def export_metrics(self) -> None:
        export_metrics_to(self._exporters, self.collect(), self._telemetry)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.export_metrics()
            except Exception:
                log.exception("metrics collection failed")

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None and not self._shut:
            self._thread = threading.Thread(target=self._loop, name="otel-ebpf-metrics", daemon=True)
            self._thread.start()

    def flush(self, timeout_s: float = 30.0) -> None:
        """Export metrics now and push all queued spans out."""
        self.export_metrics()
        for sp in self.span_processors:
            sp.force_flush(int(timeout_s * 1000))

    def process_count(self) -> int:
        with self._lock:
            return len(self._procs)

    def shutdown(self) -> None:
        if self._shut:
            return
        self._shut = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        try:
            self.flush()
        finally:
            for sp in self.span_processors:
                sp.shutdown()
            for spec in self._exporters:
                try:
                    spec.metrics.shutdown()
                except Exception:
                    log.debug("metric exporter shutdown failed", exc_info=True)
