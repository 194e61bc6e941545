"""A Prometheus endpoint serving the emitter's latest merged ``MetricsData``.

The emitter collects every process's MeterProvider into one ``MetricsData`` per interval and
hands it to each metric exporter; :class:`PrometheusMetricExporter` keeps the latest one and
serves it on ``http://<endpoint>/metrics`` (prometheus_client's HTTP server, a private
registry: no python_* / process_* series of the agent itself). So Prometheus sees exactly what
the OTLP exporters send, refreshed every ``service.metrics_interval``.

Translation reuses opentelemetry-exporter-prometheus's collector (names, units, ``_total``,
buckets, non-monotonic sums as gauges, ``otel_scope_*`` labels), after one step it lacks for a
many-resource payload: the resource attributes named in ``resource_labels`` (``process.pid``,
``service.name``, ``container.id``, ``k8s.pod.uid``, ``ml.rank``, ``hw.id`` by default) are
copied onto each data point, and all points of one metric are merged into one metric whose label
set is the union (a missing label is empty, which Prometheus treats as absent). Without that,
its collector would label a process's series with the agent's label positions. ``target_info``
is not emitted (one agent has many resources). Label names: dots become underscores
(``process.pid`` -> ``process_pid``). A metric name seen with two different data types keeps
the first (Prometheus rejects a page with two families of one name).

Threading: ``export`` (emitter timer thread) swaps the latest data under a lock; scrapes (the
HTTP server's thread) translate a snapshot. ``shutdown`` stops the server.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    Gauge,
    Histogram,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ebpf.emit.exporter_config import DEFAULT_RESOURCE_LABELS

__all__ = ["DEFAULT_RESOURCE_LABELS", "NoSpanExporter", "PrometheusMetricExporter", "flatten"]

log = logging.getLogger(__name__)

# k8s pod/namespace: per-pod GPU use is sum by (k8s_namespace_name, k8s_pod_name) (docs/nvml.md)


class NoSpanExporter(SpanExporter):
    """The span side of the Prometheus exporter: Prometheus has no spans."""

    takes_span_items = True  # nothing is made of what it drops

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def flatten(data: MetricsData, resource_labels: Iterable[str]) -> MetricsData:
    """One resource-less MetricsData: selected resource attributes moved onto the points, the
    points of each metric merged, every point of a metric carrying the same label keys."""
    keys = list(resource_labels)
    merged: dict[str, tuple[str, Metric, list[Any]]] = {}  # name -> (scope, first metric, points)
    for rm in data.resource_metrics:
        res = rm.resource.attributes
        extra = {k: res[k] for k in keys if k in res}
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                entry = merged.get(metric.name)
                if entry is None:
                    entry = merged[metric.name] = (sm.scope.name, metric, [])
                elif type(entry[1].data) is not type(metric.data):
                    log.debug("metric %s has two data types; keeping %s", metric.name, type(entry[1].data))
                    continue
                entry[2].extend(dataclasses.replace(p, attributes={**extra, **(p.attributes or {})})
                                for p in metric.data.data_points)
    scopes: dict[str, list[Metric]] = {}
    for scope, metric, points in merged.values():
        names = {k for p in points for k in p.attributes}
        points = [p if len(p.attributes) == len(names) else
                  dataclasses.replace(p, attributes={**dict.fromkeys(names, ""), **p.attributes}) for p in points]
        scopes.setdefault(scope, []).append(Metric(metric.name, metric.description, metric.unit,
                                                   _with_points(metric.data, points)))
    return MetricsData([ResourceMetrics(Resource.get_empty(), [
        ScopeMetrics(InstrumentationScope(scope), metrics, "") for scope, metrics in scopes.items()], "")])


def _with_points(data: Any, points: list[Any]) -> Any:
    if isinstance(data, Sum):
        return Sum(points, data.aggregation_temporality, data.is_monotonic)
    if isinstance(data, Histogram):
        return Histogram(points, data.aggregation_temporality)
    if isinstance(data, Gauge):
        return Gauge(points)
    return dataclasses.replace(data, data_points=points)


class _LatestCollector:
    """A prometheus_client custom collector over the latest MetricsData."""

    def __init__(self, resource_labels: Sequence[str]) -> None:
        self._labels = list(resource_labels)
        self._lock = threading.Lock()
        self._latest: MetricsData | None = None

    def set(self, data: MetricsData) -> None:
        with self._lock:
            self._latest = data

    def collect(self) -> Iterable[Any]:
        from opentelemetry.exporter.prometheus import _CustomCollector

        with self._lock:
            data = self._latest
        if data is None:
            return
        inner = _CustomCollector(disable_target_info=True)
        inner.add_metrics_data(flatten(data, self._labels))
        for family in inner.collect():
            # flatten() gives every point of a metric the union of its label names (one family per name, as
            # Prometheus requires), "" where a point lacks one; Prometheus reads label="" as no label, so leave
            # them out rather than print disk_io_operation="" on every series without one
            family.samples = [s._replace(labels={k: v for k, v in s.labels.items() if v != ""})
                              for s in family.samples]
            yield family


class PrometheusMetricExporter(MetricExporter):
    """Serves the latest exported MetricsData on ``http://host:port/metrics``. Binds in the
    constructor (port 0: any free port, see :attr:`port`); raises OSError when it cannot."""

    def __init__(self, host: str, port: int, resource_labels: Sequence[str] = DEFAULT_RESOURCE_LABELS) -> None:
        super().__init__()
        from prometheus_client import CollectorRegistry, start_http_server

        self._collector = _LatestCollector(resource_labels)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._collector)
        server, self._thread = start_http_server(port, addr=host, registry=registry)
        self._server: Any = server
        self.host = host
        self.port: int = server.server_address[1]

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        self._collector.set(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
