"""otel_ebpf.emit.emitter: records to SDK spans and metrics, one resource per process, bounded."""
from __future__ import annotations

import threading
import time
from itertools import pairwise
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.emit.sending import METRICS_DROPPED, RetryConfig
from otel_ebpf.core.events import (
    MetricRecord,
    ProcessExit,
    SpanEventRecord,
    SpanLinkRecord,
    SpanRecord,
)
from otel_ebpf.core.telemetry import DROPPED, Telemetry

T0 = 1_700_000_000_000_000_000
TRACE = 0x0123456789ABCDEF0123456789ABCDEF
SPAN = 0x1122334455667788
PARENT = 0x99AABBCCDDEEFF00


class StoringMetricExporter(MetricExporter):
    """Keeps every MetricsData it is given; can be told to fail."""

    def __init__(self, result: MetricExportResult = MetricExportResult.SUCCESS) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})
        self.exports: list[MetricsData] = []
        self.result = result
        self.shutdowns = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.exports.append(metrics_data)
        return self.result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.shutdowns += 1


def resource_of(pid: int, comm: str | None) -> dict[str, Any]:
    return {"process.pid": pid, "service.name": f"svc-{pid}", "process.executable.name": comm or "?"}


class Rig:
    def __init__(self, **kwargs: Any) -> None:
        self.spans = InMemorySpanExporter()
        self.metrics = StoringMetricExporter(kwargs.pop("result", MetricExportResult.SUCCESS))
        self.telemetry = Telemetry()
        kwargs.setdefault("metrics_interval", 3600.0)
        retry = kwargs.pop("retry", RetryConfig())
        kwargs.setdefault("resource_of", resource_of)
        self.emitter = Emitter([ExporterSpec("mem", self.spans, self.metrics, batch_delay=0.05, retry=retry)],
                               self.telemetry,
                               agent_attributes={"service.name": "otel-ebpf"},
                               **kwargs)

    def finished(self) -> list[ReadableSpan]:
        self.emitter.flush()
        return list(self.spans.get_finished_spans())

    def export(self) -> MetricsData:
        """Export once and return what the exporter got (empty MetricsData when nothing was sent)."""
        before = len(self.metrics.exports)
        assert self.emitter.flush(5.0)
        return self.metrics.exports[-1] if len(self.metrics.exports) > before else MetricsData([])


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.emitter.shutdown()


def span(pid: int = 10, **kw: Any) -> SpanRecord:
    kw.setdefault("name", "cudaLaunchKernel")
    kw.setdefault("start_ns", T0)
    kw.setdefault("end_ns", T0 + 1000)
    kw.setdefault("attributes", {})
    return SpanRecord(pid=pid, **kw)


def metric(pid: int | None = 10, name: str = "m", kind: str = "counter", value: float = 1.0, **kw: Any):
    kw.setdefault("attributes", {})
    return MetricRecord(pid=pid, name=name, kind=kind, value=value, **kw)  # type: ignore[arg-type]


def by_resource(data: MetricsData, key: str = "process.pid") -> dict[Any, dict[str, Any]]:
    """{resource attribute value: {metric name: Metric}}."""
    out: dict[Any, dict[str, Any]] = {}
    for rm in data.resource_metrics:
        found = out.setdefault(rm.resource.attributes.get(key), {})
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                found[m.name] = m
    return out


def points(m: Any) -> list[Any]:
    return list(m.data.data_points)


# ---- spans --------------------------------------------------------------------------


def test_each_pid_gets_its_own_resource(rig):
    rig.emitter.consume([span(1, comm="python"), span(2), span(1)])
    spans = rig.finished()
    assert [s.resource.attributes["process.pid"] for s in spans] == [1, 2, 1]
    assert spans[0].resource.attributes["service.name"] == "svc-1"
    assert spans[0].resource.attributes["process.executable.name"] == "python"
    assert spans[0].resource is spans[2].resource and spans[0].resource is not spans[1].resource
    assert rig.emitter.process_count() == 2


def test_extra_attributes_join_every_process_resource():
    r = Rig(extra_attributes={"deployment.environment": "test"})
    try:
        r.emitter.consume([span(1)])
        (s,) = r.finished()
        assert s.resource.attributes["deployment.environment"] == "test"
        assert s.resource.attributes["process.pid"] == 1
    finally:
        r.emitter.shutdown()


@pytest.mark.parametrize("env", [{}, {"OTEL_RESOURCE_ATTRIBUTES": "team=ml,service.name=from-env"},
                                 {"OTEL_SERVICE_NAME": "named"}])
@pytest.mark.parametrize("with_name", [True, False])
def test_process_resource_equals_the_sdks_resource_create(monkeypatch, env, with_name):
    """Golden: the detectors run once per emitter, yet each process's resource is what the
    SDK's own Resource.create(attributes) gives (env attributes, default service.name)."""
    from opentelemetry.sdk.resources import Resource

    for k in ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def attrs(pid: int, comm: str | None) -> dict[str, Any]:
        a = resource_of(pid, comm)
        if not with_name:
            del a["service.name"]
        return a

    r = Rig(resource_of=attrs)
    try:
        r.emitter.consume([span(7, comm="python")])
        (s,) = r.finished()
        want = Resource.create({**attrs(7, "python")})
        assert dict(s.resource.attributes) == dict(want.attributes)
        assert s.resource.schema_url == want.schema_url
    finally:
        r.emitter.shutdown()


def test_explicit_times_kind_scope_and_attributes(rig):
    rig.emitter.consume([span(start_ns=T0 + 5, end_ns=T0 + 905, kind="client", scope="otel_ebpf.cuda",
                              attributes={"cuda.stream": 7, "cuda.kernel": "gemm"})])
    (s,) = rig.finished()
    assert (s.start_time, s.end_time) == (T0 + 5, T0 + 905)
    assert s.kind is SpanKind.CLIENT and s.instrumentation_scope.name == "otel_ebpf.cuda"
    assert dict(s.attributes) == {"cuda.stream": 7, "cuda.kernel": "gemm"}
    assert s.status.status_code is StatusCode.UNSET


def test_end_before_start_is_clamped(rig):
    rig.emitter.consume([span(start_ns=T0 + 100, end_ns=T0)])
    (s,) = rig.finished()
    assert s.end_time == s.start_time == T0 + 100


def test_forced_ids_are_exactly_as_given(rig):
    rig.emitter.consume([span(trace_id=TRACE, span_id=SPAN, parent_span_id=PARENT)])
    (s,) = rig.finished()
    assert (s.context.trace_id, s.context.span_id) == (TRACE, SPAN)
    assert s.parent is not None and (s.parent.trace_id, s.parent.span_id) == (TRACE, PARENT)


def test_forced_root_ids_and_no_leak_to_the_next_span(rig):
    rig.emitter.consume([span(trace_id=TRACE, span_id=SPAN), span(), span()])
    forced, a, b = rig.finished()
    assert (forced.context.trace_id, forced.context.span_id, forced.parent) == (TRACE, SPAN, None)
    assert a.context.trace_id not in (0, TRACE) and a.context.span_id not in (0, SPAN)
    assert a.context.trace_id != b.context.trace_id and a.context.span_id != b.context.span_id


def test_parent_without_trace_id_gets_a_random_trace(rig):
    rig.emitter.consume([span(parent_span_id=PARENT, span_id=SPAN)])
    (s,) = rig.finished()
    assert s.parent.span_id == PARENT and s.context.span_id == SPAN
    assert s.context.trace_id == s.parent.trace_id != 0


def test_error_status(rig):
    rig.emitter.consume([span(error="cudaErrorMemoryAllocation")])
    (s,) = rig.finished()
    assert s.status.status_code is StatusCode.ERROR
    assert s.status.description == "cudaErrorMemoryAllocation"


def test_links_and_span_events(rig):
    rig.emitter.consume([span(
        links=(SpanLinkRecord(TRACE, SPAN, {"nccl.peer": 3}),),
        events=(SpanEventRecord("enqueued", T0 + 10, {"n": 1}), SpanEventRecord("done", T0 + 20)))])
    (s,) = rig.finished()
    (link,) = s.links
    assert (link.context.trace_id, link.context.span_id) == (TRACE, SPAN)
    assert dict(link.attributes) == {"nccl.peer": 3}
    assert [(e.name, e.timestamp, dict(e.attributes)) for e in s.events] == [
        ("enqueued", T0 + 10, {"n": 1}), ("done", T0 + 20, {})]


def test_bad_record_is_counted_and_the_rest_go_on(rig):
    rig.emitter.consume([span(kind="sideways"), "not a record", span(name="ok")])
    assert [s.name for s in rig.finished()] == ["ok"]
    assert rig.telemetry.get(DROPPED, receiver="emit", reason="bad_record") == 1


def test_a_span_whose_times_otlp_cannot_carry_is_counted_not_sent(rig):
    """fixed64 times: a span ending past 2**64 ns would fail its exporter's whole batch, retried until the flush
    gives up (seen: the nccl processor fed garbage GPU times by the fuzzer)."""
    rig.emitter.consume([span(name="past", end_ns=T0 + (1 << 64)), span(name="ok")])
    assert rig.emitter.flush(5)
    assert [s.name for s in rig.finished()] == ["ok"]
    assert rig.telemetry.get(DROPPED, receiver="emit", reason="bad_record") == 1


# ---- metrics ------------------------------------------------------------------------


def test_counter_updown_and_gauge(rig):
    rig.emitter.consume([
        metric(name="calls", value=2, count=3, attributes={"fn": "a"}),
        metric(name="calls", value=1, attributes={"fn": "a"}),
        metric(name="inflight", kind="updown", value=5),
        metric(name="inflight", kind="updown", value=-2),
        metric(name="mem", kind="gauge", value=100, unit="By"),
        metric(name="mem", kind="gauge", value=42, unit="By"),
    ])
    m = by_resource(rig.export())[10]
    (calls,) = points(m["calls"])
    assert calls.value == 7 and dict(calls.attributes) == {"fn": "a"} and m["calls"].data.is_monotonic
    (inflight,) = points(m["inflight"])
    assert inflight.value == 3 and not m["inflight"].data.is_monotonic
    assert points(m["mem"])[0].value == 42 and m["mem"].unit == "By"
    rig.emitter.consume([metric(name="calls", value=1, attributes={"fn": "a"})])
    assert points(by_resource(rig.export())[10]["calls"])[0].value == 8  # cumulative


def test_weighted_histogram_buckets_sum_min_max(rig):
    rig.emitter.consume([
        metric(name="lat", kind="histogram", value=3e-4, count=5, unit="s", scope="otel_ebpf.cuda"),
        metric(name="lat", kind="histogram", value=1.0, count=2, unit="s", scope="otel_ebpf.cuda"),
        metric(name="lat", kind="histogram", value=40.0, unit="s", scope="otel_ebpf.cuda"),
    ])
    data = rig.export()
    (rm,) = [r for r in data.resource_metrics if r.resource.attributes.get("process.pid") == 10]
    (sm,) = rm.scope_metrics
    assert sm.scope.name == "otel_ebpf.cuda"
    (p,) = points(sm.metrics[0])
    bounds = list(p.explicit_bounds)
    assert p.count == 8 and sum(p.bucket_counts) == 8 and len(p.bucket_counts) == len(bounds) + 1
    assert p.sum == pytest.approx(5 * 3e-4 + 2 * 1.0 + 40.0)
    assert (p.min, p.max) == (3e-4, 40.0)
    expected = [0] * (len(bounds) + 1)
    expected[bounds.index(5e-4)] = 5   # (2.5e-4, 5e-4]
    expected[bounds.index(1.0)] = 2    # upper bounds are inclusive
    expected[bounds.index(60.0)] = 1   # (30, 60]
    assert list(p.bucket_counts) == expected


def test_agent_metrics_and_telemetry_are_on_the_agent_resource(rig):
    rig.telemetry.dropped("cuda", "ringbuf_full", 3)
    rig.emitter.consume([metric(pid=None, name="otel_ebpf.custom", value=4)])
    agent = by_resource(rig.export(), "service.name")["otel-ebpf"]
    (dropped,) = points(agent["otel_ebpf.events.dropped"])
    assert dropped.value == 3 and dict(dropped.attributes) == {"receiver": "cuda", "reason": "ringbuf_full"}
    assert points(agent["otel_ebpf.custom"])[0].value == 4
    assert rig.emitter.process_count() == 0


def test_telemetry_added_later_is_exported_too(rig):
    rig.export()
    rig.telemetry.add("otel_ebpf.probes.failed", 2, receiver="nccl", library="libnccl.so.2")
    agent = by_resource(rig.export(), "service.name")["otel-ebpf"]
    assert points(agent["otel_ebpf.probes.failed"])[0].value == 2


def test_process_exit_exports_once_more_then_releases():
    rig = Rig(exit_grace=0.0)
    rig.emitter.consume([metric(pid=10, value=1), metric(pid=11, value=1), span(10)])
    rig.emitter.consume([ProcessExit(pid=10, time_ns=T0, comm="python", exit_code=0),
                         ProcessExit(pid=999, time_ns=T0, comm="never seen", exit_code=0)])
    assert rig.emitter.process_count() == 2  # released at the next collection, not before
    assert set(by_resource(rig.export())) >= {10, 11}
    assert rig.emitter.process_count() == 1
    assert 10 not in by_resource(rig.export())
    rig.emitter.shutdown()


def test_exited_process_keeps_its_resource_for_late_aggregates(rig):
    """In-kernel launch counts of a process are read up to a stats interval after it exits:
    within the grace period they still land on its resource, which is not re-created."""
    rig.emitter.consume([metric(pid=10, value=1), ProcessExit(pid=10, time_ns=T0, comm="python", exit_code=0)])
    rig.export()
    rig.emitter.consume([metric(pid=10, value=2)])  # late
    assert rig.emitter.process_count() == 1
    (late,) = points(by_resource(rig.export())[10]["m"])
    assert late.value == 3  # same cumulative series: the provider was kept


def test_eviction_keeps_the_evicted_metrics_for_the_next_export():
    r = Rig(max_processes=2)
    try:
        r.emitter.consume([metric(pid=1, value=5), metric(pid=2, value=1), span(2),
                           metric(pid=3, value=1)])
        assert r.emitter.process_count() == 2
        assert r.telemetry.get("otel_ebpf.processes.evicted") == 1
        data = by_resource(r.export())
        assert points(data[1]["m"])[0].value == 5 and {2, 3} <= set(data)
        assert points(by_resource(r.export(), "service.name")["otel-ebpf"]
                      ["otel_ebpf.processes.evicted"])[0].value == 1
        assert 1 not in by_resource(r.export())  # exported once, then gone
    finally:
        r.emitter.shutdown()


def test_eviction_is_least_recently_used():
    r = Rig(max_processes=2)
    try:
        r.emitter.consume([span(1), span(2), span(1), span(3)])  # 2 is the least recently used
        r.emitter.consume([span(1)])
        spans = r.finished()
        assert spans[0].resource is spans[4].resource  # pid 1 kept its provider
        assert r.telemetry.get("otel_ebpf.processes.evicted") == 1
    finally:
        r.emitter.shutdown()


def test_failed_metric_export_is_counted():
    r = Rig(result=MetricExportResult.FAILURE, retry=RetryConfig(enabled=False))
    try:
        r.emitter.consume([metric()])
        r.emitter.flush(5.0)
        assert r.telemetry.get("otel_ebpf.export.failed", signal="metrics", exporter="mem") == 1
        assert r.telemetry.get(METRICS_DROPPED, exporter="mem", reason="export_failed") == 1
    finally:
        r.emitter.shutdown()


def test_nothing_to_export_sends_nothing(rig):
    rig.emitter.export_metrics_data(MetricsData([]))
    (queue,) = rig.emitter.metric_queues
    assert queue.flush(5.0) and queue.size() == 0
    assert rig.metrics.exports == []


# ---- lifecycle ----------------------------------------------------------------------


def test_timer_exports_metrics_after_start():
    r = Rig(metrics_interval=0.05)
    try:
        r.emitter.consume([metric()])
        r.emitter.start()
        deadline = time.monotonic() + 5
        while not r.metrics.exports and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.metrics.exports
    finally:
        r.emitter.shutdown()


def test_warmup_collects_every_second_then_at_the_interval():
    """service.metrics_warmup: a short job gets readings every second (its charts have points), a long one
    falls back to metrics_interval once the warm-up is over."""
    r = Rig(metrics_interval=3600.0, metrics_warmup=60.0)
    try:
        r.emitter.consume([metric()])
        started = time.monotonic()
        assert r.emitter._wait_s(started) == 1.0
        assert r.emitter._wait_s(started - 61.0) == 3600.0
        r.emitter.start()  # an hour's interval, yet readings come every second while warming up
        deadline = time.monotonic() + 10
        while len(r.metrics.exports) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(r.metrics.exports) >= 2
    finally:
        r.emitter.shutdown()
    short = Rig(metrics_interval=0.2, metrics_warmup=60.0)  # an interval under a second is kept
    assert short.emitter._wait_s(time.monotonic()) == 0.2
    off = Rig(metrics_interval=3600.0)  # the Emitter's default: no warm-up (the agent passes the config's)
    assert off.emitter._wait_s(time.monotonic()) == 3600.0


def test_shutdown_flushes_and_is_idempotent():
    r = Rig()
    r.emitter.start()
    r.emitter.consume([span(name="last"), metric(name="final", value=9)])
    r.emitter.shutdown()
    assert [s.name for s in r.spans.get_finished_spans()] == ["last"]
    (data,) = r.metrics.exports
    assert points(by_resource(data)[10]["final"])[0].value == 9
    assert r.metrics.shutdowns == 1
    r.emitter.shutdown()
    assert len(r.metrics.exports) == 1 and r.metrics.shutdowns == 1


def test_shutdown_without_start():
    r = Rig()
    r.emitter.shutdown()
    r.emitter.shutdown()
    assert r.metrics.shutdowns == 1


# ---- exporter isolation ---------------------------------------------------------------


class HangingSpans(InMemorySpanExporter):
    """A span exporter whose export blocks until ``release`` (a blackholed collector), or until
    shutdown (as the SDK's OTLP exporter, whose channel close aborts the call)."""

    def __init__(self) -> None:
        super().__init__()
        self.release, self.entered, self.closed = threading.Event(), threading.Event(), threading.Event()

    def export(self, spans):  # type: ignore[no-untyped-def]
        self.entered.set()
        while not self.release.wait(0.01):
            if self.closed.is_set():
                return SpanExportResult.FAILURE
        return super().export(spans)

    def shutdown(self) -> None:
        self.closed.set()


class HangingMetrics(StoringMetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.release.wait(30)
        return super().export(metrics_data)


def two_exporters(**kw: Any) -> tuple[Emitter, Telemetry, HangingSpans, HangingMetrics, Rig]:
    """'stuck' (spans and metrics hang) and 'mem' (in memory) side by side."""
    ok = Rig()  # only for its exporters
    ok.emitter.shutdown()
    ok.spans, ok.metrics = InMemorySpanExporter(), StoringMetricExporter()
    stuck_spans, stuck_metrics = HangingSpans(), HangingMetrics()
    tel = Telemetry()
    kw.setdefault("metrics_interval", 3600.0)
    emitter = Emitter([ExporterSpec("stuck", stuck_spans, stuck_metrics, queue_size=100, batch_size=10,
                                    batch_delay=0.01, metrics_queue_size=2),
                       ExporterSpec("mem", ok.spans, ok.metrics, queue_size=100_000, batch_delay=0.01)],
                      tel, resource_of=resource_of, agent_attributes={"service.name": "otel-ebpf"}, **kw)
    return emitter, tel, stuck_spans, stuck_metrics, ok


def test_a_hung_exporter_delays_neither_the_pipeline_nor_the_other_exporter():
    emitter, tel, stuck, stuck_metrics, ok = two_exporters()
    try:
        emitter.consume([span()])
        assert stuck.entered.wait(5)  # its worker now hangs in export
        t0 = time.monotonic()
        for _ in range(50):
            emitter.consume([span()] * 100)
        took = time.monotonic() - t0
        assert took < 5.0, took  # the old 2 s wait for room per span would take 2 s x 4,900 here
        # the stuck exporter holds at most its queue_size (100), the rest of its 5,000 is counted
        (q_stuck, q_mem) = emitter.span_queues
        assert q_stuck.size() == 100 and tel.get(DROPPED, receiver="stuck", reason="export_queue_full") == 4901
        assert tel.get(DROPPED, receiver="mem") == 0
        assert q_mem.flush(10) and len(ok.spans.get_finished_spans()) == 5001
        print(f"\n5,000 spans consumed in {took * 1000:.0f} ms while one exporter hung")
    finally:
        stuck.release.set()
        stuck_metrics.release.set()
        emitter.shutdown()


def test_metrics_are_collected_on_time_while_a_span_and_a_metric_exporter_hang():
    interval = 0.1
    emitter, tel, stuck, stuck_metrics, ok = two_exporters(metrics_interval=interval)
    try:
        emitter.consume([span(), metric()])
        assert stuck.entered.wait(5)
        emitter.start()
        got: list[float] = []
        end = time.monotonic() + 2.0
        while time.monotonic() < end:  # the healthy exporter gets every collection
            if len(ok.metrics.exports) > len(got):
                got.extend([time.monotonic()] * (len(ok.metrics.exports) - len(got)))
            # the emitter's lock is never held while an exporter waits: the pipeline can always take it
            assert emitter._lock.acquire(timeout=0.5)
            emitter._lock.release()
            time.sleep(0.005)
        gaps = [b - a for a, b in pairwise(got)]
        assert len(got) >= 2.0 / interval * 0.5, len(got)
        assert max(gaps) < interval * 5, gaps  # shared CPUs: 5x the interval, against a 30 s hang
        # the hung metric exporter keeps at most 2 collections (one in flight), the older ones dropped, counted
        stuck_q = emitter.metric_queues[0]
        assert stuck_q.size() == 2
        assert tel.get("otel_ebpf.metrics.dropped", exporter="stuck", reason="export_queue_full") >= len(got) - 3
        print(f"\n{len(got)} collections in 2 s at a {interval}s interval, largest gap {max(gaps) * 1000:.0f} ms")
    finally:
        stuck.release.set()
        stuck_metrics.release.set()
        emitter.shutdown()


def test_queue_depth_and_capacity_are_exported_per_exporter():
    emitter, _tel, stuck, stuck_metrics, _ok = two_exporters()
    try:
        emitter.consume([span()] * 30)
        assert stuck.entered.wait(5)
        data = emitter.collect()
        agent = by_resource(data, "service.name")["otel-ebpf"]
        size = {(p.attributes["exporter"], p.attributes["signal"]): p.value
                for p in points(agent["otel_ebpf.exporter.queue.size"])}
        cap = {(p.attributes["exporter"], p.attributes["signal"]): p.value
               for p in points(agent["otel_ebpf.exporter.queue.capacity"])}
        assert cap == {("stuck", "spans"): 100, ("mem", "spans"): 100_000, ("stuck", "metrics"): 2,
                       ("mem", "metrics"): 4}
        assert size[("stuck", "spans")] == 30  # 10 in flight + 20 queued
    finally:
        stuck.release.set()
        stuck_metrics.release.set()
        emitter.shutdown()


def test_shutdown_is_bounded_with_a_hung_exporter_and_counts_the_rest():
    emitter, tel, stuck, stuck_metrics, ok = two_exporters(shutdown_timeout=0.5)
    stuck_metrics.release.set()  # only its spans hang
    emitter.consume([span()] * 25)
    assert stuck.entered.wait(5)
    t0 = time.monotonic()
    emitter.shutdown()
    took = time.monotonic() - t0
    assert took < 0.5 + 2.0 + 1.0, took
    # the batch in flight was aborted by the exporter's shutdown (failed), the 15 queued never went
    expected = {("stuck", "export_failed"): 10, ("stuck", "export_shutdown"): 15}
    assert {r: tel.get(DROPPED, receiver=r[0], reason=r[1]) for r in expected} == expected
    assert len(ok.spans.get_finished_spans()) == 25
    # the last metrics, collected after the span queues closed, carry those counts
    agent = by_resource(ok.metrics.exports[-1], "service.name")["otel-ebpf"]
    assert {(dict(p.attributes)["receiver"], dict(p.attributes)["reason"]): p.value
            for p in points(agent["otel_ebpf.events.dropped"])} == expected
    print(f"\nshutdown with a hung exporter: {took:.2f}s")


def test_a_resource_follows_exec_once_the_cache_rereads_the_process(tmp_path):
    """Issue 18: ``run -- python train.py`` forks the agent, which execs the command; a record
    seen before the exec built the pid's resource from the fork's /proc (the agent's own command
    line), and every later span and metric kept it. Wired as the Agent wires them, the cache's
    re-read at exec replaces the resource for later records; what was recorded before goes out
    once more on the old one."""
    from otel_ebpf.host.processes import ResourceCache
    from tests.unit.host.test_resources import make_proc

    make_proc(tmp_path, 4242, cmdline=b"/usr/bin/python3\0/usr/bin/otel-ebpf\0run\0--\0python\0train.py\0")
    cache = ResourceCache(proc_root=str(tmp_path))
    rig = Rig(resource_of=cache.get)
    cache.subscribe(rig.emitter.resource_changed)
    rig.emitter.consume([metric(pid=4242, value=1), span(4242, name="before")])
    make_proc(tmp_path, 4242, cmdline=b"python\0train.py\0")  # exec: same pid and start time
    cache.refresh(4242)
    cache.refresh(4242)  # every receiver sees the exec: one new resource, not one per receiver
    rig.emitter.consume([metric(pid=4242, value=2), span(4242, name="after")])
    lines = {s.name: s.resource.attributes["process.command_line"] for s in rig.finished()}
    assert lines == {"before": "/usr/bin/python3 /usr/bin/otel-ebpf run -- python train.py",
                     "after": "python train.py"}
    rig.export()
    values = {(rm.resource.attributes["process.command_line"], p.value)
              for data in rig.metrics.exports for rm in data.resource_metrics
              if rm.resource.attributes.get("process.pid") == 4242
              for sm in rm.scope_metrics for m in sm.metrics for p in points(m)}
    assert values == {("/usr/bin/python3 /usr/bin/otel-ebpf run -- python train.py", 1), ("python train.py", 2)}
    assert rig.emitter.process_count() == 1
    rig.emitter.shutdown()


def test_up_down_totals_move_with_the_process_across_exec(tmp_path):
    """RSS is an up-down counter fed as deltas: after an exec the new resource started from 0 and read
    negative once the process freed memory (-31 MB in a real run). At the exec the old resource's total
    ends at 0 and the new one starts from it; counters (totals of events) stay where they were made."""
    from otel_ebpf.host.processes import ResourceCache
    from tests.unit.host.test_resources import make_proc

    make_proc(tmp_path, 4343, cmdline=b"/bin/sh\0-c\0exec python train.py\0")
    cache = ResourceCache(proc_root=str(tmp_path))
    rig = Rig(resource_of=cache.get)
    cache.subscribe(rig.emitter.resource_changed)
    rss = {"name": "process.memory.usage", "kind": "updown", "unit": "By"}
    rig.emitter.consume([metric(pid=4343, value=30_000_000, **rss), metric(pid=4343, value=1_000, **rss),
                         metric(pid=4343, name="calls", value=5)])
    make_proc(tmp_path, 4343, cmdline=b"python\0train.py\0")
    cache.refresh(4343)
    rig.emitter.consume([metric(pid=4343, value=-12_000_000, **rss)])
    rig.export()
    last: dict[tuple[str, str], float] = {}
    for data in rig.metrics.exports:
        for rm in data.resource_metrics:
            if rm.resource.attributes.get("process.pid") == 4343:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        for p in points(m):
                            last[(rm.resource.attributes["process.command_line"], m.name)] = p.value
    assert last == {("/bin/sh -c exec python train.py", "process.memory.usage"): 0,
                    ("/bin/sh -c exec python train.py", "calls"): 5,
                    ("python train.py", "process.memory.usage"): 30_001_000 - 12_000_000}
    rig.emitter.shutdown()
