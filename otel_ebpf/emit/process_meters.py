"""One traced process's metrics: its own SDK ``MeterProvider`` on its ``Resource``, read by a
pull reader, plus its weighted histograms (:class:`~otel_ebpf.emit.histograms.HistogramStore`).

Counter and up-down deltas are summed per series until the next collection (bounded at
``_MAX_PENDING_SERIES`` series, beyond which the sums go to the SDK at once): the SDK's ``add()``
costs ~15 µs (a Measurement, attribute cleaning and hashing), paid once per series per
interval. Not thread-safe: the :class:`~otel_ebpf.emit.emitter.Emitter` holds its lock around
every call.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ebpf.core.events import MetricRecord
from otel_ebpf.emit.histograms import HistogramStore

__all__ = ["ProcessMeters"]

_MAX_PENDING_SERIES = 4096  # counter series summed per process between collections


@dataclass
class ProcessMeters:
    meters: MeterProvider
    reader: InMemoryMetricReader
    resource: Resource
    histograms: HistogramStore = field(default_factory=lambda: HistogramStore(2048))
    instruments: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    pending: dict[tuple[Any, ...], list[Any]] = field(default_factory=dict)
    exited_ns: int | None = None  # when its ProcessExit arrived
    # up-down series -> [record, running total]: what hand_over() moves to the next resource at exec (bounded)
    updown: dict[tuple[Any, ...], list[Any]] = field(default_factory=dict)

    @classmethod
    def on(cls, resource: Resource) -> ProcessMeters:
        """A fresh provider on ``resource`` with its own pull reader."""
        reader = InMemoryMetricReader()
        meters = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
        return cls(meters, reader, resource)

    def flush_pending(self) -> None:
        """Hand the summed deltas to the SDK instruments."""
        for inst, attrs, total in self.pending.values():
            inst.add(total, attrs)
        self.pending.clear()

    def record(self, rec: MetricRecord) -> bool:
        """Record ``rec``; False when a histogram series over the store's limit was dropped."""
        if rec.kind == "histogram":
            return self.histograms.record(rec.scope, rec.name, rec.unit, rec.description,
                                          rec.attributes, rec.value, rec.count, time.time_ns(), rec.buckets)
        key = (rec.scope, rec.name, rec.kind)
        inst = self.instruments.get(key)
        if inst is None:
            meter = self.meters.get_meter(rec.scope)
            make: Callable[..., Any] = {"counter": meter.create_counter, "updown": meter.create_up_down_counter,
                                        "gauge": meter.create_gauge}[rec.kind]
            inst = self.instruments[key] = make(rec.name, unit=rec.unit, description=rec.description)
        if rec.kind == "gauge":
            inst.set(rec.value, dict(rec.attributes))
            return True
        series = (key, *rec.attributes.items())
        if rec.kind == "updown":
            running = self.updown.get(series)
            if running is not None:
                running[1] += rec.value * rec.count
            elif len(self.updown) < _MAX_PENDING_SERIES:
                self.updown[series] = [rec, rec.value * rec.count]
        slot = self.pending.get(series)
        if slot is None:
            if len(self.pending) >= _MAX_PENDING_SERIES:  # bounded: hand the sums to the SDK now
                self.flush_pending()
            self.pending[series] = [inst, dict(rec.attributes), rec.value * rec.count]
        else:
            slot[2] += rec.value * rec.count
        return True

    def hand_over(self, to: ProcessMeters) -> None:
        """The process exec'd and its records move to ``to`` (a new resource): each up-down total (RSS,
        outstanding GPU memory: sums of deltas) ends at 0 here and starts from it there, so the new
        resource reads the process's real value, not its deltas since the exec (which went negative: RSS
        read -31 MB after a python exec'd itself)."""
        for rec, total in list(self.updown.values()):
            if total:
                self.record(replace(rec, value=-total, count=1))
                to.record(replace(rec, value=total, count=1))

    def collect(self, now_ns: int) -> ResourceMetrics | None:
        """Everything recorded so far (SDK instruments and histograms, merged per scope), or
        None when there is nothing."""
        self.flush_pending()
        scopes: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for rm in (data.resource_metrics if data else ()):
            for sm in rm.scope_metrics:
                scopes.setdefault(sm.scope.name, []).extend(sm.metrics)
        for scope, metrics in self.histograms.collect(now_ns).items():
            scopes.setdefault(scope, []).extend(metrics)
        if not scopes:
            return None
        return ResourceMetrics(self.resource, [ScopeMetrics(InstrumentationScope(s), m, "")
                                               for s, m in scopes.items()], "")
