"""The emit stage: the only place where records become OTel SDK spans, metrics and log records.

Each traced process is its own OTel ``Resource`` (``process.pid``, executable, container...)
with its own ``MeterProvider``. Spans arrive finished, with known times and (sometimes derived)
ids, so they are built directly as the SDK's ``ReadableSpan`` (:mod:`.spans`) and put, without
waiting, on each exporter's own span queue (spans carry their resource; the OTLP encoder groups
them). Each MeterProvider has a pull reader (:mod:`.process_meters`); one timer thread collects
them all every ``metrics_interval``, adds the weighted histograms, and puts a single merged
``MetricsData`` on each exporter's own metric queue. Log records (:class:`LogRecord`) are built
as the SDK's ``ReadableLogRecord`` (:mod:`.logs`) on the same per-process resource as that
pid's spans and put on each exporter's own log queue, as spans are.

Exporter isolation: every exporter has a span, a metric and a log
:class:`~otel_ebpf.emit.sending.SendingQueue` (bounded, its own worker thread, batching,
retries with backoff, every drop counted), so a slow, failing or blackholed exporter never
delays the pipeline worker, metric collection, or any other exporter. Their fill is exported as
``otel_ebpf.exporter.queue.size`` / ``otel_ebpf.exporter.queue.capacity`` {exporter, signal}.
An exporter without spans or logs (Prometheus) has no queue for them: nothing is sent there,
nothing counted.

Bounds: at most ``max_processes`` providers. When a process exits (ProcessExit) its metrics
are exported until ``exit_grace`` has passed (late in-kernel aggregates still find it), then its
provider is released; when the limit is hit, the least recently
used process is flushed the same way and the eviction counted
(``otel_ebpf.events.dropped{reason=process_evicted}`` counts nothing lost, only state freed:
see ``otel_ebpf.processes.evicted``).

Threading: ``consume`` runs on the pipeline worker, collection on the timer thread; one lock
guards the provider table, and nothing waits while holding it (queue puts never block).
``shutdown`` sends the queued spans and log records, then the last metrics, within
``shutdown_timeout`` (plus a short grace for the metrics): what is left is counted (reason
``export_shutdown``).
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
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData, ResourceMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_ebpf.emit.exporters import BatchConfig, RetryConfig
from otel_ebpf.emit.logs import LogBuilder
from otel_ebpf.emit.process_meters import ProcessMeters
from otel_ebpf.emit.prometheus import NoSpanExporter
from otel_ebpf.emit.sdklog import quiet_sdk_export_logs
from otel_ebpf.emit.sending import SendingQueue
from otel_ebpf.emit.spans import SpanBuilder, SpanItem, readable_spans
from otel_ebpf.core.events import LogRecord, MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.core.telemetry import Telemetry

__all__ = ["Emitter", "ExporterSpec"]

log = logging.getLogger(__name__)
_BATCH = BatchConfig()  # the documented defaults
_METRICS_GRACE_S = 5.0  # at shutdown: the last metrics get at least this long after the spans
_WARMUP_INTERVAL_S = 1.0  # metrics interval during service.metrics_warmup: a 5 s job gets ~5 readings, not 0


@dataclass
class ExporterSpec:
    """One configured exporter: its id, SDK exporters (owned by the Emitter from then on), span
    batching, queue bounds and retries. ``logs``: its log record exporter, None where the
    exporter takes no logs (Prometheus); log records are batched and bounded like spans
    (``queue_size``, ``batch_size``, ``batch_delay``), in a queue of their own."""

    name: str
    spans: SpanExporter
    metrics: MetricExporter
    queue_size: int = _BATCH.queue_size
    batch_size: int = _BATCH.batch_size
    batch_delay: float = _BATCH.batch_delay
    retry: RetryConfig = field(default_factory=RetryConfig)
    metrics_queue_size: int = _BATCH.metrics_queue_size
    logs: LogRecordExporter | None = None

    @classmethod
    def of(cls, name: str, spans: SpanExporter, metrics: MetricExporter, cfg: Any,
           logs: LogRecordExporter | None = None) -> ExporterSpec:
        """From an exporter config (``batch`` and ``retry_on_failure`` sections)."""
        b: BatchConfig = cfg.batch
        return cls(name, spans, metrics, b.queue_size, b.batch_size, b.batch_delay, cfg.retry_on_failure,
                   b.metrics_queue_size, logs)


#: the sending queues' gauges: name -> (kind, unit, description) (tests/unit/test_deploy.py's catalog reads it)
QUEUE_METRICS = {
    "otel_ebpf.exporter.queue.size": ("gauge", "1", "Items held by an exporter's sending queue (queued or being "
                                                    "sent): spans, log records, or metric collections."),
    "otel_ebpf.exporter.queue.capacity": ("gauge", "1", "Most items an exporter's sending queue holds."),
}


def _span_sender(spec: ExporterSpec) -> Callable[[list[ReadableSpan | SpanItem]], bool]:
    """The queue's batches as they are to an exporter of ours (``takes_span_items``: the file and OTLP exporters
    write span items in C); any other SDK exporter gets the ReadableSpans made of them, on the queue's thread."""
    if getattr(spec.spans, "takes_span_items", False):
        return lambda batch: spec.spans.export(batch) == SpanExportResult.SUCCESS  # type: ignore[arg-type]
    return lambda batch: spec.spans.export(readable_spans(batch)) == SpanExportResult.SUCCESS


def _log_sender(exporter: LogRecordExporter) -> Callable[[list[ReadableLogRecord]], bool]:
    return lambda batch: exporter.export(batch) == LogRecordExportResult.SUCCESS


def _metric_sender(spec: ExporterSpec) -> Callable[[list[MetricsData]], bool]:
    def send(batch: list[MetricsData]) -> bool:
        return all(spec.metrics.export(d, timeout_millis=10_000) == MetricExportResult.SUCCESS for d in batch)
    return send


class Emitter:
    """Consumer of SpanRecord, MetricRecord, LogRecord and ProcessExit; passes nothing on.

    Owns the exporters of ``exporters`` (shut down in :meth:`shutdown`). ``span_queues`` (one per
    exporter with spans), ``log_queues`` (one per exporter with logs) and ``metric_queues`` (one
    per exporter) are public for readers of their room (the gateway's ExportGate); only the
    Emitter puts to them. ``encode_ahead`` (the gateway): an exporter that can (the OTLP ones,
    ``encode_ahead``: otlp_proto.encode_ahead) gets each span encoded as its queue takes it, on the
    thread that hands it over, and its queue holds the bytes instead of the span."""

    def __init__(self, exporters: Sequence[ExporterSpec], telemetry: Telemetry, *,
                 resource_of: Callable[[int, str | None], Mapping[str, Any]],
                 agent_attributes: Mapping[str, Any], extra_attributes: Mapping[str, str] | None = None,
                 max_processes: int = 1024, metrics_interval: float = 10.0, exit_grace: float = 5.0,
                 shutdown_timeout: float = 30.0, metrics_warmup: float = 0.0, encode_ahead: bool = False) -> None:
        self._exporters = list(exporters)
        self._telemetry = telemetry
        quiet_sdk_export_logs()
        self._resource_of = resource_of
        self._extra = dict(extra_attributes or {})
        self._max = max_processes
        self._interval = metrics_interval
        self._warmup = metrics_warmup  # collect every _WARMUP_INTERVAL_S this long after start (short jobs)
        self._grace_ns = int(exit_grace * 1e9)
        self._shutdown_timeout = shutdown_timeout
        self._lock = threading.RLock()
        self._procs: OrderedDict[int, ProcessMeters] = OrderedDict()
        self._retired: list[ResourceMetrics] = []
        self._spans = SpanBuilder()
        self._logs = LogBuilder()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shut = False
        # Resource.create runs the SDK's resource detectors (a thread pool each time): run them
        # once; base.merge(Resource(attrs)) equals Resource.create(attrs) (tests/unit/test_emitter.py)
        self._base_resource = Resource.create({})
        self._agent = ProcessMeters.on(self._base_resource.merge(Resource(dict(agent_attributes))))
        # Prometheus has no spans: no span queue (and no thread) for it
        self.span_queues: list[SendingQueue[ReadableSpan | SpanItem]] = [
            SendingQueue(e.name, "spans", _span_sender(e), e.spans.shutdown, telemetry, capacity=e.queue_size,
                         batch_size=e.batch_size, batch_delay=e.batch_delay, retry=e.retry,
                         prepare=getattr(e.spans, "encode_ahead", None) if encode_ahead else None)
            for e in self._exporters if not isinstance(e.spans, NoSpanExporter)]
        self.log_queues: list[SendingQueue[ReadableLogRecord]] = [
            SendingQueue(e.name, "logs", _log_sender(e.logs), e.logs.shutdown, telemetry, capacity=e.queue_size,
                         batch_size=e.batch_size, batch_delay=e.batch_delay, retry=e.retry)
            for e in self._exporters if e.logs is not None]
        self.metric_queues: list[SendingQueue[MetricsData]] = [
            SendingQueue(e.name, "metrics", _metric_sender(e), e.metrics.shutdown, telemetry,
                         capacity=e.metrics_queue_size, retry=e.retry, drop_oldest=True)
            for e in self._exporters]
        for spec in self._exporters:
            if isinstance(spec.spans, NoSpanExporter):
                spec.spans.shutdown()
        self._observed: set[str] = set()
        self._register_queue_gauges()
        self.spans_emitted = 0
        self.logs_emitted = 0

    # ---- providers -------------------------------------------------------------------
    def _proc(self, pid: int | None, comm: str | None) -> ProcessMeters:
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
        proc = ProcessMeters.on(self._base_resource.merge(Resource(attrs)))
        self._procs[pid] = proc
        return proc

    def resource_changed(self, pid: int, attributes: Mapping[str, Any]) -> None:
        """``pid`` exec'd (``ResourceCache.subscribe``): from now on its records go on a resource of
        ``attributes`` (plus the extra attributes). What it recorded before is exported once more on
        the old resource, which is then let go; nothing happens when the pid has no provider yet or
        its resource is already that one. Any thread; never raises."""
        attrs = dict(attributes)
        attrs.update(self._extra)
        resource = self._base_resource.merge(Resource(attrs))
        with self._lock:
            proc = self._procs.get(pid)
            if proc is None or proc.resource.attributes == resource.attributes:
                return
            fresh = ProcessMeters.on(resource)
            proc.hand_over(fresh)  # up-down totals move: the old resource ends at 0, the new one starts there
            self._retire(proc)
            fresh.exited_ns = proc.exited_ns
            self._procs[pid] = fresh

    def _retire(self, proc: ProcessMeters) -> None:
        """Keep a process's final metrics for the next export, then let it go."""
        rm = proc.collect(time.time_ns())
        if rm is not None:
            self._retired.append(rm)

    # ---- consume ---------------------------------------------------------------------
    def consume(self, events: Sequence[object]) -> None:
        """Build spans, metrics and log records from ``events``; spans and log records go to
        every exporter's queue without waiting (a full queue counts them dropped). Never raises
        for a bad record."""
        spans: list[ReadableSpan | SpanItem] = []
        logs: list[ReadableLogRecord] = []
        item = self._spans.item
        last_pid, resource = -1, None  # the resource of the last span's process: spans come in runs of one process
        with self._lock:
            for ev in events:
                try:
                    if isinstance(ev, SpanRecord):
                        if not (0 <= ev.start_ns < 1 << 64 and ev.end_ns < 1 << 64):  # OTLP's fixed64: one such
                            raise ValueError(f"span times {ev.start_ns}..{ev.end_ns}")  # span fails its whole batch
                        if ev.pid != last_pid or resource is None:
                            resource, last_pid = self._proc(ev.pid, ev.comm).resource, ev.pid
                        spans.append(item(ev, resource))
                    elif isinstance(ev, LogRecord):
                        resource = None  # another _proc call may retire the last span's process
                        logs.append(self._logs.build(ev, self._proc(ev.pid, ev.comm).resource))
                    elif isinstance(ev, MetricRecord):
                        resource = None
                        if not self._proc(ev.pid, ev.comm).record(ev):
                            self._telemetry.dropped("emit", "histogram_series_limit")
                    elif isinstance(ev, ProcessExit):
                        proc = self._procs.get(ev.pid)
                        if proc is not None and proc.exited_ns is None:
                            proc.exited_ns = time.time_ns()
                except Exception:  # a bad record must not stop the others
                    log.debug("cannot emit %r", ev, exc_info=True)
                    self._telemetry.dropped("emit", "bad_record")
            self.spans_emitted += len(spans)
            self.logs_emitted += len(logs)
        self.export_spans(spans)
        self.export_logs(logs)

    def export_spans(self, spans: Sequence[ReadableSpan | SpanItem]) -> None:
        """Put finished spans (SDK spans, or span items: otel_ebpf.emit.spans) on every exporter's span queue.
        Never waits; thread-safe."""
        if spans:
            for q in self.span_queues:
                q.put(spans)

    def export_logs(self, logs: Sequence[ReadableLogRecord]) -> None:
        """Put SDK log records on every exporter's log queue (none for an exporter without
        logs). Never waits; thread-safe."""
        if logs:
            for q in self.log_queues:
                q.put(logs)

    # ---- metrics collection ----------------------------------------------------------
    def _observe(self, name: str) -> Callable[[CallbackOptions], list[Observation]]:
        def callback(_: CallbackOptions) -> list[Observation]:
            return [Observation(v, a) for n, a, v in self._telemetry.snapshot() if n == name]
        return callback

    def _register_telemetry(self) -> None:
        meter = self._agent.meters.get_meter("otel_ebpf.service.agent")
        for name, _attrs, _v in self._telemetry.snapshot():
            if name not in self._observed:
                self._observed.add(name)
                meter.create_observable_counter(name, [self._observe(name)], unit="1",
                                                description=Telemetry.description(name))

    def _register_queue_gauges(self) -> None:
        """``otel_ebpf.exporter.queue.size`` / ``.capacity`` {exporter, signal}: spans for
        signal=spans, log records for signal=logs, metric collections for signal=metrics (the Collector's
        ``otelcol_exporter_queue_size`` / ``otelcol_exporter_queue_capacity``)."""
        def observe(read: Callable[[SendingQueue[Any]], int]) -> Callable[[CallbackOptions], list[Observation]]:
            def callback(_: CallbackOptions) -> list[Observation]:
                queues: list[SendingQueue[Any]] = [*self.span_queues, *self.log_queues, *self.metric_queues]
                return [Observation(read(q), {"exporter": q.name, "signal": q.signal}) for q in queues]
            return callback
        meter = self._agent.meters.get_meter("otel_ebpf.service.agent")
        reads: dict[str, Callable[[SendingQueue[Any]], int]] = {
            "otel_ebpf.exporter.queue.size": lambda q: q.size(),
            "otel_ebpf.exporter.queue.capacity": lambda q: q.capacity}
        for name, (_kind, unit, description) in QUEUE_METRICS.items():
            meter.create_observable_gauge(name, [observe(reads[name])], unit=unit, description=description)

    def collect(self) -> MetricsData:
        """Collect every process's metrics (and release exited ones) into one MetricsData."""
        now = time.time_ns()
        with self._lock:
            self._register_telemetry()
            out, self._retired = self._retired, []
            for pid in list(self._procs):
                proc = self._procs[pid]
                rm = proc.collect(now)
                if rm is not None:
                    out.append(rm)
                # Released only after a grace period: in-kernel aggregates (launch counts) of a
                # process are read up to one stats interval after it exited.
                if proc.exited_ns is not None and now - proc.exited_ns >= self._grace_ns:
                    del self._procs[pid]
            agent = self._agent.collect(now)
            if agent is not None:
                out.append(agent)
        return MetricsData(resource_metrics=out)

    def export_metrics(self) -> None:
        """Collect now and put the result on every exporter's metric queue (never waits)."""
        self.export_metrics_data(self.collect())

    def export_metrics_data(self, data: MetricsData) -> None:
        """Put ``data`` on every exporter's metric queue; empty data is not sent. Thread-safe."""
        if data.resource_metrics:
            for q in self.metric_queues:
                q.put([data])

    def _wait_s(self, started: float) -> float:
        """Seconds to the next collection: every ``_WARMUP_INTERVAL_S`` (at most ``metrics_interval``) during
        the first ``metrics_warmup`` seconds after :meth:`start`, then every ``metrics_interval``."""
        if time.monotonic() - started < self._warmup:
            return min(_WARMUP_INTERVAL_S, self._interval)
        return self._interval

    def _loop(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(self._wait_s(started)):
            try:
                self.export_metrics()
            except Exception:
                log.exception("metrics collection failed")

    # ---- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None and not self._shut:
            self._thread = threading.Thread(target=self._loop, name="otel-ebpf-metrics", daemon=True)
            self._thread.start()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Collect metrics now, then wait (at most ``timeout_s`` in all) until every exporter has
        sent what its queues held. False when some queue was not empty in time."""
        self.export_metrics()
        deadline = time.monotonic() + timeout_s
        queues: list[SendingQueue[Any]] = [*self.span_queues, *self.log_queues, *self.metric_queues]
        return all([q.flush(max(0.0, deadline - time.monotonic())) for q in queues])

    def deliveries(self) -> list[tuple[str, str, int, dict[str, int]]]:
        """(exporter, signal, items sent, {reason: items lost}) of every sending queue so far: what the
        end-of-run summary says per exporter. Spans and log records count one each, metrics one per
        collection. Thread-safe."""
        queues: list[SendingQueue[Any]] = [*self.span_queues, *self.log_queues, *self.metric_queues]
        return [(q.name, q.signal, q.sent, dict(q.lost)) for q in queues]

    def mark_failing(self, exporter: str) -> None:
        """Treat ``exporter`` as down until one of its exports succeeds (its endpoint could not be
        reached at start): at shutdown its queues are not waited for (:class:`SendingQueue`)."""
        queues: list[SendingQueue[Any]] = [*self.span_queues, *self.log_queues, *self.metric_queues]
        for q in queues:
            if q.name == exporter:
                q.failing = True

    def process_count(self) -> int:
        with self._lock:
            return len(self._procs)

    def shutdown(self, deadline: float | None = None) -> None:
        """Send the queued spans and log records (all exporters at once, until ``deadline``, time.monotonic(),
        default ``shutdown_timeout`` from now), then the last metrics (until that deadline, or
        ``_METRICS_GRACE_S`` from then if later); count the rest and shut every exporter down.
        Safe twice and without start."""
        if self._shut:
            return
        self._shut = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        if deadline is None:
            deadline = time.monotonic() + self._shutdown_timeout
        try:
            queues: list[SendingQueue[Any]] = [*self.span_queues, *self.log_queues]
            for q in queues:
                q.close()
            for q in queues:
                q.join(deadline)
            try:  # after the spans: drops counted there are in these last metrics
                self.export_metrics()
            except Exception:
                log.exception("final metrics collection failed")
        finally:
            deadline = max(deadline, time.monotonic() + _METRICS_GRACE_S)
            for mq in self.metric_queues:
                mq.close()
            for mq in self.metric_queues:
                mq.join(deadline)
