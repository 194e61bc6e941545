"""Cumulative explicit-bucket histograms that accept weighted observations.

In-kernel aggregation hands us "value v seen n times" (kernel launches by grid size) or whole
bucket counts over these same bounds (CUDA call durations and sizes); the SDK instrument API
would need one ``record`` call per observation. A series fed bucket counts has no min/max (the
kernel does not keep them): they are left out of its points, as OTLP allows. This store adds
n in O(log buckets) and yields SDK ``Metric`` objects that the SDK's OTLP encoders export like
any other histogram. Bounded: at most ``max_series`` series; beyond it new series are dropped and counted by the
caller via the return value of :meth:`record`. Not thread-safe: the emitter holds its lock.
"""
from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
)

from otel_ebpf.core.buckets import bounds_for_unit

__all__ = ["HistogramStore"]


@dataclass
class _Series:
    bounds: tuple[float, ...]
    start_ns: int
    counts: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0
    lo: float = float("inf")
    hi: float = float("-inf")
    extremes: bool = True  # min/max known (no bucket counts merged)


class HistogramStore:
    def __init__(self, max_series: int = 8192) -> None:
        self._max = max_series
        # (scope, name) -> (unit, description, {attrs_key: series})
        self._metrics: dict[tuple[str, str], tuple[str, str, dict[tuple[Any, ...], _Series]]] = {}
        self._n = 0

    def record(self, scope: str, name: str, unit: str, description: str,
               attributes: Mapping[str, object], value: float, count: int, now_ns: int,
               buckets: Sequence[int] | None = None) -> bool:
        """Add ``value`` ``count`` times; or, with ``buckets`` (``len(bounds_for_unit(unit)) + 1``
        counts), add those bucket counts, ``count`` observations summing to ``value``. False when
        the series limit dropped it, or the buckets do not match the bounds."""
        entry = self._metrics.get((scope, name))
        if entry is None:
            entry = self._metrics[(scope, name)] = (unit, description, {})
        key = tuple(sorted(attributes.items()))
        series = entry[2].get(key)
        if series is None:
            if self._n >= self._max:
                return False
            bounds = bounds_for_unit(unit)
            series = entry[2][key] = _Series(bounds, now_ns, [0] * (len(bounds) + 1))
            self._n += 1
        if buckets is not None:
            if len(buckets) != len(series.counts):
                return False
            for i, n in enumerate(buckets):
                series.counts[i] += n
            series.count += count
            series.total += value
            series.extremes = False
            return True
        series.counts[bisect.bisect_left(series.bounds, value)] += count
        series.count += count
        series.total += value * count
        series.lo = min(series.lo, value)
        series.hi = max(series.hi, value)
        return True

    def collect(self, now_ns: int) -> dict[str, list[Metric]]:
        """Cumulative SDK metrics grouped by scope name."""
        out: dict[str, list[Metric]] = {}
        for (scope, name), (unit, desc, series_map) in self._metrics.items():
            points = [HistogramDataPoint(attributes=dict(k), start_time_unix_nano=s.start_ns,
                                         time_unix_nano=now_ns, count=s.count, sum=s.total,
                                         bucket_counts=list(s.counts), explicit_bounds=list(s.bounds),
                                         min=s.lo if s.extremes else None,  # type: ignore[arg-type]
                                         max=s.hi if s.extremes else None)  # type: ignore[arg-type]
                      for k, s in series_map.items()]
            if points:
                out.setdefault(scope, []).append(Metric(
                    name=name, description=desc, unit=unit,
                    data=Histogram(data_points=points,
                                   aggregation_temporality=AggregationTemporality.CUMULATIVE)))
        return out

    def __len__(self) -> int:
        return self._n
