"""otel_ebpf.core.processing: the processor skeleton (dispatch in order, pass-through, counted handler
errors, lifecycle), the METRICS-table records and the per-batch counter sums."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from otel_ebpf.core.events import MetricRecord, ProcessExit
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.core.processing import EventProcessor, MetricSpec, Sums, handles, metric_record
from otel_ebpf.core.telemetry import DROPPED

METRICS: dict[str, MetricSpec] = {
    "t.count": ("counter", "{thing}", "Things seen."),
    "t.latency": ("histogram", "s", "Time a thing took."),
}


@dataclass(frozen=True)
class Thing:
    n: int


@dataclass(frozen=True)
class Other:
    n: int


@dataclass(frozen=True)
class SubThing(Thing):
    pass


class Counting(EventProcessor[dict]):
    NAME = "counting"
    SCOPE = "otel_ebpf.test"
    METRICS = METRICS

    @handles(Thing)
    def _thing(self, ev: Thing, out: list[object]) -> None:
        if ev.n < 0:
            out.append("partial")  # what a handler wrote before it failed stays, as in every processor
            raise ValueError("negative thing")
        self.metric(out, ev.n, "t.count", 1)

    @handles(Other, ProcessExit)
    def _other(self, ev: Other | ProcessExit, out: list[object]) -> None:
        out.append(("other", ev))


def _rig() -> tuple[Counting, ListConsumer, Context]:
    ctx, sink = Context(), ListConsumer()
    return Counting({"k": 1}, ctx, sink), sink, ctx


def test_events_are_dispatched_by_exact_type_in_order_and_the_rest_passes_unchanged() -> None:
    proc, sink, _ = _rig()
    exit_ = ProcessExit(7, 1, "x", 0)
    sub = SubThing(3)
    proc.consume(["a", Thing(5), Other(1), sub, exit_, 42])
    assert [type(e).__name__ for e in sink.events] == ["str", "MetricRecord", "tuple", "SubThing", "tuple", "int"]
    assert sink.events[0] == "a" and sink.events[3] is sub and sink.events[5] == 42
    assert sink.events[2] == ("other", Other(1)) and sink.events[4] == ("other", exit_)
    assert proc.config == {"k": 1}
    assert Counting.HANDLERS == {Thing: "_thing", Other: "_other", ProcessExit: "_other"}


def test_a_handler_error_is_counted_under_the_processor_name_and_the_batch_goes_on() -> None:
    proc, sink, ctx = _rig()
    proc.consume([Thing(-1), Thing(2), "b", Thing(-2)])
    assert ctx.telemetry.get(DROPPED, receiver="counting", reason="bad_event") == 2
    assert [e if isinstance(e, str) else e.pid for e in sink.events] == ["partial", 2, "b", "partial"]


def test_an_empty_result_is_not_passed_on() -> None:
    class Eating(EventProcessor[None]):
        NAME = "eating"

        @handles(Thing)
        def _eat(self, ev: Thing, out: list[object]) -> None:
            pass

    calls: list[list[object]] = []

    class Spy:
        def consume(self, events: list[object]) -> None:
            calls.append(list(events))

    proc = Eating(None, Context(), Spy())
    proc.consume([Thing(1), Thing(2)])
    proc.consume([])
    assert calls == []
    proc.consume([Thing(1), "kept"])
    assert calls == [["kept"]]


def test_start_and_shutdown_are_safe_without_start_and_twice() -> None:
    proc, sink, _ = _rig()
    proc.shutdown()
    proc.shutdown()
    proc.start()
    proc.consume([Thing(1)])
    proc.shutdown()
    proc.shutdown()
    assert len(sink.events) == 1


def test_metric_records_take_kind_unit_and_description_from_the_table() -> None:
    proc, sink, _ = _rig()
    proc.consume([Thing(9)])
    assert sink.events == [MetricRecord(9, "t.count", "counter", 1, {}, unit="{thing}",
                                        description="Things seen.", scope="otel_ebpf.test")]
    rec = metric_record(METRICS, "s", None, "t.latency", 0.5, {"a": 1}, count=4)
    assert (rec.kind, rec.unit, rec.count, rec.attributes, rec.pid) == ("histogram", "s", 4, {"a": 1}, None)
    first, second = metric_record(METRICS, "s", 1, "t.count", 1), metric_record(METRICS, "s", 1, "t.count", 1)
    assert first.attributes == {} and first.attributes is not second.attributes
    with pytest.raises(KeyError):
        metric_record(METRICS, "s", 1, "t.unknown", 1)


def test_a_subclass_may_take_a_type_over_and_mistakes_fail_at_class_creation() -> None:
    class Override(Counting):
        NAME = "override"

        @handles(Thing)
        def _mine(self, ev: Thing, out: list[object]) -> None:
            out.append("mine")

    assert Override.HANDLERS[Thing] == "_mine" and Override.HANDLERS[Other] == "_other"
    with pytest.raises(TypeError, match="NAME"):
        class Nameless(EventProcessor[None]):
            pass
    with pytest.raises(TypeError, match="two handlers"):
        class Twice(EventProcessor[None]):
            NAME = "twice"

            @handles(Thing)
            def _a(self, ev: Thing, out: list[object]) -> None: ...

            @handles(Thing)
            def _b(self, ev: Thing, out: list[object]) -> None: ...
    with pytest.raises(TypeError, match="at least one"):
        handles()


def test_sums_add_per_series_and_flush_one_record_each_in_first_added_order() -> None:
    sums = Sums(METRICS, "otel_ebpf.test")
    sums.add(1, "t.count", 1, {"b": 2, "a": 1})
    sums.add(None, "t.count", 5, {})
    sums.add(1, "t.count", 2, {"a": 1, "b": 2})  # same series, other key order
    sums.add(1, "t.count", 0.5, {"a": 2})
    assert len(sums) == 3
    out: list[object] = []
    sums.flush(out)
    assert out == [
        MetricRecord(1, "t.count", "counter", 3, {"a": 1, "b": 2}, "{thing}", "Things seen.", "otel_ebpf.test"),
        MetricRecord(None, "t.count", "counter", 5, {}, "{thing}", "Things seen.", "otel_ebpf.test"),
        MetricRecord(1, "t.count", "counter", 0.5, {"a": 2}, "{thing}", "Things seen.", "otel_ebpf.test")]
    assert type(out[0].value) is int  # an int sum stays an int (exported as one)
    assert list(out[0].attributes) == ["a", "b"]
    out.clear()
    sums.flush(out)
    assert out == [] and len(sums) == 0
    sums.add(1, "t.unknown", 1, {})
    with pytest.raises(KeyError):
        sums.flush(out)


def test_the_batch_sums_are_flushed_after_the_events_and_a_failed_event_may_pass_on() -> None:
    class Summing(EventProcessor[None]):
        NAME = "summing"
        SCOPE = "otel_ebpf.test"
        METRICS = METRICS

        @handles(Thing)
        def _thing(self, ev: Thing, out: list[object]) -> None:
            if ev.n < 0:
                raise ValueError("negative thing")
            self.sums.add(None, "t.count", ev.n, {"k": "v"})

        def failed(self, event: object, out: list[object]) -> None:
            out.append(("failed", event))

    ctx, sink = Context(), ListConsumer()
    proc = Summing(None, ctx, sink)
    proc.consume([Thing(2), "x", Thing(-1), Thing(3)])
    assert sink.events[:2] == ["x", ("failed", Thing(-1))]
    (rec,) = sink.events[2:]
    assert isinstance(rec, MetricRecord) and (rec.name, rec.value, rec.attributes) == ("t.count", 5, {"k": "v"})
    assert ctx.telemetry.get(DROPPED, receiver="summing", reason="bad_event") == 0
    sink.take()
    proc.consume([Thing(1)])
    assert [e.value for e in sink.events if isinstance(e, MetricRecord)] == [1]  # flushed: a new batch starts at 0
