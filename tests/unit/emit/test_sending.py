"""otel_ebpf.emit.sending: one exporter's bounded queue, worker, batching, retries and drop counts."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.emit.exporters import FileExporterConfig, OtlpExporterConfig
from otel_ebpf.emit.sending import METRICS_DROPPED, RetryConfig, SendingQueue
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.telemetry import DROPPED, Telemetry

FAST = RetryConfig(initial_interval=0.05, max_interval=0.1, max_elapsed_time=30.0)


class Wire:
    """A fake wire exporter: records batches and attempt times; fails the first ``fail`` attempts
    (or always, with fail=-1); blocks while ``gate`` is clear; ``closed`` once shut down."""

    def __init__(self, fail: int = 0, blocking: bool = False, obey_close: bool = True) -> None:
        self.batches: list[list[Any]] = []
        self.attempts: list[float] = []
        self.fail, self.obey_close = fail, obey_close
        self.gate = threading.Event()
        if not blocking:
            self.gate.set()
        self.entered = threading.Event()
        self.closed = threading.Event()

    def export(self, batch: list[Any]) -> bool:
        self.attempts.append(time.monotonic())
        self.entered.set()
        while not self.gate.wait(0.01):
            if self.closed.is_set() and self.obey_close:
                return False  # as the SDK's OTLP exporter: shutdown aborts the export in progress
        if self.fail < 0 or len(self.attempts) <= self.fail:
            return False
        self.batches.append(list(batch))
        return True

    def close(self) -> None:
        self.closed.set()


def make(wire: Wire, tel: Telemetry, signal: str = "spans", **kw: Any) -> SendingQueue[Any]:
    kw.setdefault("capacity", 100)
    kw.setdefault("retry", FAST)
    kw.setdefault("batch_size", 10)
    return SendingQueue("x", signal, wire.export, wire.close, tel, **kw)


def until(pred: Callable[[], object], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)
    return bool(pred())


def lost(tel: Telemetry, reason: str) -> int:
    return tel.get(DROPPED, receiver="x", reason=reason)


def test_full_batches_go_at_once_the_rest_after_the_delay():
    wire, tel = Wire(), Telemetry()
    q = make(wire, tel, batch_size=10, batch_delay=0.3)
    try:
        t0 = time.monotonic()
        assert q.put(list(range(25))) == 25
        assert until(lambda: len(wire.batches) == 2, 0.25)  # two full batches, before the delay
        assert [len(b) for b in wire.batches] == [10, 10]
        assert until(lambda: len(wire.batches) == 3, 5)
        waited = time.monotonic() - t0
        assert wire.batches[2] == list(range(20, 25)) and waited >= 0.25, waited  # the partial one waited
        assert q.sent == 25 and q.size() == 0
    finally:
        q.join(time.monotonic() + 5)


def test_flush_sends_a_partial_batch_without_waiting_for_the_delay():
    wire, tel = Wire(), Telemetry()
    q = make(wire, tel, batch_size=10, batch_delay=60)
    try:
        q.put([1, 2, 3])
        t0 = time.monotonic()
        assert q.flush(5)
        assert time.monotonic() - t0 < 2 and wire.batches == [[1, 2, 3]]
    finally:
        q.join(time.monotonic() + 5)


def test_full_queue_refuses_new_items_counts_them_and_bounds_what_it_holds():
    wire, tel = Wire(blocking=True), Telemetry()
    q = make(wire, tel, capacity=10, batch_size=4)
    try:
        assert q.put([0, 1, 2, 3]) == 4
        assert wire.entered.wait(5)  # the worker holds 0..3 in flight
        assert q.put(list(range(4, 14))) == 6  # room for 6 more: the bound counts the batch in flight
        assert q.size() == 10 and lost(tel, "export_queue_full") == 4
        assert q.put([99]) == 0 and lost(tel, "export_queue_full") == 5
        wire.gate.set()
        assert q.flush(5)
        assert [x for b in wire.batches for x in b] == list(range(10))
        assert q.sent == 10 and lost(tel, "export_failed") == 0
    finally:
        q.join(time.monotonic() + 5)


def test_metric_queue_drops_the_oldest_collection_and_counts_it():
    wire, tel = Wire(blocking=True), Telemetry()
    q = make(wire, tel, signal="metrics", capacity=2, drop_oldest=True)
    try:
        q.put(["c1"])
        assert wire.entered.wait(5)  # c1 in flight
        q.put(["c2"])
        q.put(["c3"])  # full: c2 (queued, oldest) makes room
        assert tel.get(METRICS_DROPPED, exporter="x", reason="export_queue_full") == 1
        assert tel.get(DROPPED) == 0  # metric collections are not events
        wire.gate.set()
        assert q.flush(5)
        assert wire.batches == [["c1"], ["c3"]]
    finally:
        q.join(time.monotonic() + 5)


def test_a_failed_batch_is_retried_with_backoff_until_it_goes_out():
    wire, tel = Wire(fail=4), Telemetry()
    q = make(wire, tel, retry=RetryConfig(initial_interval=0.1, max_interval=0.2, max_elapsed_time=30))
    try:
        q.put(["a", "b"])
        assert q.flush(10)
        assert wire.batches == [["a", "b"]] and len(wire.attempts) == 5
        gaps = [b - a for a, b in pairwise(wire.attempts)]
        # 0.1, 0.15, 0.2, 0.2 s, each +-50 %: never below half the initial interval, never above 1.5 x max
        assert min(gaps) >= 0.05 and max(gaps) <= 0.3 + 0.2, gaps
        assert tel.get("otel_ebpf.export.failed", signal="spans", exporter="x") == 4
        assert tel.get(DROPPED) == 0 and q.sent == 2
    finally:
        q.join(time.monotonic() + 5)


def test_retries_run_out_after_max_elapsed_time_and_the_batch_is_counted():
    wire, tel = Wire(fail=-1), Telemetry()
    q = make(wire, tel, retry=RetryConfig(initial_interval=0.05, max_interval=0.05, max_elapsed_time=0.5))
    try:
        t0 = time.monotonic()
        q.put([1, 2, 3])
        assert until(lambda: lost(tel, "export_failed") == 3, 5)
        took = time.monotonic() - t0
        assert 0.3 <= took <= 2.0, took
        assert len(wire.attempts) >= 5 and q.sent == 0 and q.size() == 0
        q.put([4])  # the queue goes on with the next batch
        assert until(lambda: lost(tel, "export_failed") == 4, 5)
    finally:
        q.join(time.monotonic() + 5)


def test_without_retries_a_failed_batch_is_counted_at_once():
    wire, tel = Wire(fail=-1), Telemetry()
    q = make(wire, tel, retry=RetryConfig(enabled=False))
    try:
        q.put([1, 2])
        assert q.flush(5)
        assert len(wire.attempts) == 1 and lost(tel, "export_failed") == 2
    finally:
        q.join(time.monotonic() + 5)


def test_put_never_waits_for_a_hung_exporter():
    wire, tel = Wire(blocking=True), Telemetry()
    q = make(wire, tel, capacity=1000, batch_size=100)
    try:
        q.put([0])
        assert wire.entered.wait(5)
        t0 = time.monotonic()
        accepted = sum(q.put([i]) for i in range(20_000))
        took = time.monotonic() - t0
        assert accepted == 999 and lost(tel, "export_queue_full") == 20_000 - 999
        assert took < 2.0, took  # ~10 us a put here; a wait of any length per put would show
    finally:
        wire.gate.set()
        q.join(time.monotonic() + 5)


def test_join_sends_what_is_queued_then_shuts_the_wire_down():
    wire, tel = Wire(), Telemetry()
    q = make(wire, tel, batch_size=10, batch_delay=60)
    q.put(list(range(15)))
    assert q.join(time.monotonic() + 5) == 0
    assert [x for b in wire.batches for x in b] == list(range(15)) and wire.closed.is_set()
    assert q.put([1]) == 0 and lost(tel, "export_shutdown") == 1  # closed: counted, not queued


def test_join_is_bounded_with_a_hung_exporter_and_counts_what_is_left_once():
    wire, tel = Wire(blocking=True, obey_close=False), Telemetry()
    q = make(wire, tel, batch_size=5)
    q.put(list(range(12)))
    assert wire.entered.wait(5)
    t0 = time.monotonic()
    assert q.join(t0 + 0.3) == 12  # 5 in flight + 7 queued
    took = time.monotonic() - t0
    assert took < 0.3 + 2.0 + 0.5, took  # the deadline plus the abort grace
    assert wire.closed.is_set() and lost(tel, "export_shutdown") == 12
    wire.gate.set()  # the hung export returns late: already counted, not counted again
    time.sleep(0.2)
    assert tel.get(DROPPED) == 12 and q.sent == 0


def test_join_interrupts_a_retry_wait():
    wire, tel = Wire(fail=-1), Telemetry()
    q = make(wire, tel, retry=RetryConfig(initial_interval=30, max_interval=30, max_elapsed_time=300))
    q.put([1, 2])
    assert until(lambda: wire.attempts, 5)
    t0 = time.monotonic()
    q.join(t0 + 0.2)
    assert time.monotonic() - t0 < 1.5
    assert tel.get(DROPPED, receiver="x") == 2  # counted once, as failed or as left at shutdown


def test_retry_keys_are_documented_validated_and_name_their_path():
    cfg = build(OtlpExporterConfig, {"retry_on_failure": {"initial_interval": "200ms", "max_interval": "2s",
                                                          "max_elapsed_time": "1m"}}, "exporters.otlp")
    assert (cfg.retry_on_failure.initial_interval, cfg.retry_on_failure.max_interval,
            cfg.retry_on_failure.max_elapsed_time) == (0.2, 2.0, 60.0)
    assert FileExporterConfig().retry_on_failure.enabled
    bad = [({"max_interval": "100ms"}, "max_interval"), ({"initial_interval": 0}, "initial_interval"),
           ({"max_elapsed_time": "48h"}, "max_elapsed_time"), ({"backoff": 1}, "backoff")]
    for data, key in bad:
        with pytest.raises(ConfigError) as info:
            build(OtlpExporterConfig, {"retry_on_failure": data}, "exporters.otlp")
        assert info.value.path == f"exporters.otlp.retry_on_failure.{key}"
    with pytest.raises(ConfigError) as info:
        build(FileExporterConfig, {"batch": {"metrics_queue_size": 0}}, "exporters.file")
    assert info.value.path == "exporters.file.batch.metrics_queue_size"


# ---- shutdown with the endpoint down (issue 18: a 5 s job took 20 s, then 65 s, to exit) ------------------------
SLOW_RETRY = RetryConfig(initial_interval=5.0, max_interval=5.0, max_elapsed_time=300.0)


def test_a_failed_attempt_at_shutdown_is_not_retried_and_the_rest_is_counted_at_once() -> None:
    tel, wire = Telemetry(), Wire(fail=-1, blocking=True)
    q = make(wire, tel, retry=SLOW_RETRY, batch_delay=60.0)
    q.put(list(range(25)))  # 2 full batches go at once, 5 wait for their delay
    assert wire.entered.wait(5)
    q.close()
    wire.gate.set()  # the attempt in flight fails now, after the close
    t0 = time.monotonic()
    assert q.join(time.monotonic() + 60.0) == 0
    took = time.monotonic() - t0
    assert took < 1.0, took  # not a 5 s retry wait, not the 60 s deadline
    assert len(wire.attempts) == 1
    assert q.lost == {"export_failed": 25} and tel.get(DROPPED, receiver="x", reason="export_failed") == 25


def test_a_queue_failing_when_shutdown_begins_is_not_waited_for() -> None:
    tel, wire = Telemetry(), Wire(fail=-1)
    q = make(wire, tel, retry=SLOW_RETRY, batch_delay=60.0)
    q.put(list(range(10)))
    assert until(lambda: q.failing)  # its first attempt failed; it now waits 5 s to retry
    q.put(list(range(3)))
    t0 = time.monotonic()
    # the batch waiting for its retry (counted by the worker when the close ends its wait, or by join) and the
    # 3 queued (never attempted)
    assert q.join(time.monotonic() + 60.0) in (3, 13)
    assert time.monotonic() - t0 < 1.0
    assert wire.closed.is_set() and len(wire.attempts) == 1
    assert q.lost == {"export_failed": 13} and q.sent == 0


def test_an_endpoint_unreachable_at_start_gets_no_attempt_at_shutdown() -> None:
    tel, wire = Telemetry(), Wire(blocking=True)  # would hang: an unreachable endpoint's connect
    q = make(wire, tel, batch_delay=60.0)
    q.failing = True  # as Emitter.mark_failing after the start's connection check
    q.put(list(range(4)))
    t0 = time.monotonic()
    assert q.join(time.monotonic() + 60.0) == 4
    assert time.monotonic() - t0 < 1.0 and not wire.attempts
    assert q.lost == {"export_failed": 4}


def test_a_healthy_queue_is_still_sent_in_full_at_shutdown() -> None:
    tel, wire = Telemetry(), Wire()
    q = make(wire, tel, batch_delay=60.0)
    q.put(list(range(25)))
    assert q.join(time.monotonic() + 5.0) == 0
    assert q.sent == 25 and q.lost == {} and not q.failing


def test_prepare_gets_what_there_is_room_for_in_order_and_a_failing_one_leaves_the_items_as_they_are():
    """An OTLP exporter's queue encodes spans ahead as it takes them (Emitter's encode_ahead): the items it has room
    for go through ``prepare`` on the caller's thread, the refused ones do not (no work for what is dropped), the
    bound and the drop count are those of the items, and a prepare that raises costs nothing but the encoding."""
    seen: list[list[int]] = []

    def prepare(items: Any) -> list[Any]:
        seen.append(list(items))
        if 666 in items:
            raise MemoryError("no room to encode")
        return [("ahead", x) for x in items]

    wire, tel = Wire(blocking=True), Telemetry()
    q = make(wire, tel, capacity=10, batch_size=4, prepare=prepare)
    try:
        assert q.put([0, 1, 2, 3]) == 4
        assert wire.entered.wait(5)
        assert q.put(list(range(4, 14))) == 6
        assert seen == [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]  # 10..13 refused: never prepared
        assert lost(tel, "export_queue_full") == 4 and q.size() == 10
        assert q.put([99]) == 0 and seen[-1] == [4, 5, 6, 7, 8, 9]  # full: nothing prepared
        wire.gate.set()
        assert q.flush(5)
        assert [x for b in wire.batches for x in b] == [("ahead", x) for x in range(10)]
        assert q.put([666, 667]) == 2 and q.flush(5)
        assert wire.batches[-1] == [666, 667] and lost(tel, "export_failed") == 0
    finally:
        q.join(time.monotonic() + 5)


def test_the_gateways_otlp_queues_hold_spans_encoded_ahead_and_send_the_bytes_they_would_have_sent(tmp_path: Any):
    """With encode_ahead the Emitter's OTLP queue holds (bytes, resource, scope) tuples, and its exporter sends the
    same request bytes as without; the file exporter's queue, which cannot take them, keeps the spans."""
    from otel_ebpf.emit.emitter import Emitter
    from otel_ebpf.emit.emitter import ExporterSpec
    from otel_ebpf.emit.jsonfile import JsonLinesSpanExporter
    from otel_ebpf.emit.otlp_direct import DirectGrpcSpanExporter
    from otel_ebpf.emit.otlp_proto import spans_to_otlp_proto
    from tests.unit.emit.test_otlpenc import traced_spans

    class Capture(DirectGrpcSpanExporter):
        def __init__(self) -> None:
            self.requests: list[bytes] = []

        def export(self, batch: Any) -> Any:
            from opentelemetry.sdk.trace.export import SpanExportResult

            self.requests.append(spans_to_otlp_proto(batch))
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    from tests.unit.emit.test_emitter import StoringMetricExporter

    spans = traced_spans()
    sent: dict[bool, bytes] = {}
    for ahead in (False, True):
        otlp = Capture()
        specs = [ExporterSpec("otlp", otlp, StoringMetricExporter()),
                 ExporterSpec("file", JsonLinesSpanExporter(tmp_path / str(ahead)), StoringMetricExporter())]
        emitter = Emitter(specs, Telemetry(), resource_of=lambda pid, comm: {}, agent_attributes={},
                          encode_ahead=ahead)
        try:
            grpc_q, file_q = emitter.span_queues
            grpc_q._cond.acquire()  # the worker cannot take a batch meanwhile: what the queue holds is seen
            try:
                emitter.export_spans(spans)
                held = list(grpc_q._items)
                assert all(type(x) is tuple and len(x) == 3 for x in held) == ahead
                assert all(x is s for x, s in zip(held, spans, strict=True)) != ahead
            finally:
                grpc_q._cond.release()
            assert grpc_q.flush(5) and file_q.flush(5)
            sent[ahead] = b"".join(otlp.requests)
        finally:
            emitter.shutdown()
    assert sent[True] == sent[False] == spans_to_otlp_proto(spans)
