"""otel_ebpf.emit.histograms: weighted cumulative explicit-bucket histograms."""
from __future__ import annotations

import itertools

import pytest
from opentelemetry.sdk.metrics.export import AggregationTemporality, Histogram

from otel_ebpf.emit.histograms import HistogramStore, bounds_for_unit


def only_point(store: HistogramStore, now: int = 2000, scope: str = "s"):
    (metric,) = store.collect(now)[scope]
    (point,) = metric.data.data_points
    return metric, point


def test_bounds_for_unit():
    seconds, other = bounds_for_unit("s"), bounds_for_unit("By")
    assert seconds != other and list(seconds) == sorted(seconds) and list(other) == sorted(other)
    assert other[0] == 1.0 and all(b == 4 * a for a, b in itertools.pairwise(other))
    assert 1e-3 in seconds and seconds[-1] == 60.0


def test_weighted_record_is_count_observations():
    store = HistogramStore()
    assert store.record("s", "bytes", "By", "Bytes copied.", {"dir": "h2d"}, 100.0, 4, now_ns=1000)
    assert store.record("s", "bytes", "By", "Bytes copied.", {"dir": "h2d"}, 5000.0, 1, now_ns=1500)
    metric, p = only_point(store)
    assert (metric.name, metric.unit, metric.description) == ("bytes", "By", "Bytes copied.")
    assert isinstance(metric.data, Histogram)
    assert metric.data.aggregation_temporality is AggregationTemporality.CUMULATIVE
    assert dict(p.attributes) == {"dir": "h2d"}
    assert (p.count, p.sum, p.min, p.max) == (5, 5400.0, 100.0, 5000.0)
    assert (p.start_time_unix_nano, p.time_unix_nano) == (1000, 2000)
    bounds = list(p.explicit_bounds)
    expected = [0] * (len(bounds) + 1)
    expected[bounds.index(256.0)] += 4   # (64, 256]
    expected[bounds.index(16384.0)] += 1  # (4096, 16384]
    assert list(p.bucket_counts) == expected


@pytest.mark.parametrize(("value", "bucket"), [(0.0, 0), (1.0, 0), (1.5, 1), (4.0, 1), (4.1, 2)])
def test_upper_bounds_are_inclusive(value, bucket):  # bounds 1, 4, 16, ...: (-inf, 1], (1, 4], (4, 16]
    store = HistogramStore()
    store.record("s", "n", "1", "", {}, value, 1, 0)
    counts = list(only_point(store)[1].bucket_counts)
    assert counts[bucket] == 1 and sum(counts) == 1


def test_values_above_the_last_bound_go_to_the_overflow_bucket():
    store = HistogramStore()
    store.record("s", "lat", "s", "", {}, 3600.0, 2, 0)
    counts = list(only_point(store)[1].bucket_counts)
    assert counts[-1] == 2 and sum(counts) == 2


def test_collect_is_cumulative_and_does_not_reset():
    store = HistogramStore()
    store.record("s", "n", "1", "", {}, 2.0, 1, 0)
    assert only_point(store, 10)[1].count == 1
    store.record("s", "n", "1", "", {}, 2.0, 3, 20)
    p = only_point(store, 30)[1]
    assert p.count == 4 and p.start_time_unix_nano == 0


def test_series_by_attributes_and_scope():
    store = HistogramStore()
    store.record("a", "n", "1", "", {"k": 1, "j": 2}, 1.0, 1, 0)
    store.record("a", "n", "1", "", {"j": 2, "k": 1}, 1.0, 1, 0)  # same series, other order
    store.record("a", "n", "1", "", {"k": 2}, 1.0, 1, 0)
    store.record("b", "n", "1", "", {}, 1.0, 1, 0)
    out = store.collect(5)
    assert set(out) == {"a", "b"} and len(store) == 3
    (metric,) = out["a"]
    assert sorted(p.count for p in metric.data.data_points) == [1, 2]


def test_series_limit_refuses_new_series_but_feeds_old_ones():
    store = HistogramStore(max_series=2)
    assert store.record("s", "n", "1", "", {"i": 1}, 1.0, 1, 0)
    assert store.record("s", "m", "1", "", {"i": 1}, 1.0, 1, 0)
    assert not store.record("s", "n", "1", "", {"i": 2}, 1.0, 1, 0)
    assert store.record("s", "n", "1", "", {"i": 1}, 1.0, 1, 0)
    assert len(store) == 2
    counts = {m.name: [p.count for p in m.data.data_points] for m in store.collect(1)["s"]}
    assert counts == {"n": [2], "m": [1]}


def test_empty_store_collects_nothing():
    assert HistogramStore().collect(1) == {}
