"""Application tracepoints without BPF: the SDK's disabled path, argument checking and payload
bounds; apptrace.h as gcc lays it out == RECORD; decoding begin/point/end records into events
and the per-thread current app span; the store's nesting and bounds; the processor."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_ebpf import tracepoints
from otel_ebpf.core.events import MetricRecord, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.apptrace import AppTraceProcessor
from otel_ebpf.processors.apptrace import Config as ProcessorConfig
from otel_ebpf.receivers import apptrace
from otel_ebpf.receivers.apptrace.events import AppPoint, AppSpan
from otel_ebpf.receivers.apptrace.receiver import AT_EV_EVENT, RECORD
from otel_ebpf.receivers.apptrace.store import PER_THREAD, AppContextStore
from otel_ebpf.core.telemetry import Telemetry

from tests.support.layout import assert_mirror, format_offsets, measure

APPTRACE_DIR = Path(apptrace.__file__).resolve().parent


def test_record_layout_matches_gcc(tmp_path: Path) -> None:
    c = measure(APPTRACE_DIR, "apptrace.h", tmp_path, structs={RECORD.c_struct: RECORD.fields}, values=["AT_EV_EVENT"])
    assert_mirror(c, RECORD.c_struct, RECORD.fmt, RECORD.fields)
    assert RECORD.etype == AT_EV_EVENT == c.values["AT_EV_EVENT"] and RECORD.size == 376
    assert RECORD.fields[0] == "type" and format_offsets(RECORD.fmt)[0] == (0, 1)


def _raw(kind: int, *, pid: int = 7, tid: int = 8, ts: int = 1000, trace: int = 0, parent: int = 0, span: int = 0,
         name: bytes = b"batch", payload: bytes = b"{}") -> bytes:
    return RECORD.fmt.pack(AT_EV_EVENT, kind, pid, tid, ts, trace >> 64, trace & (2**64 - 1), parent, span, b"app",
                           name, payload)


def _receiver() -> tuple[apptrace.AppTraceReceiver, Context]:
    ctx = Context()
    return apptrace.create(apptrace.Config(), ctx, ListConsumer()), ctx


def test_decode_pairs_begin_and_end_and_sets_the_current_span() -> None:
    rx, ctx = _receiver()
    trace = 0x1234_5678_9ABC_DEF0_0FED_CBA9_8765_4321
    assert rx.decode(AT_EV_EVENT, _raw(1, trace=trace, parent=5, span=99, payload=b'{"size":4}')) is None
    store = ctx.app_context
    assert store is rx.store
    begin_ns = rx.clock.to_epoch_ns(1000)
    assert store.lookup(7, 8, begin_ns + 10) == (trace, 99)
    assert store.lookup(7, 9, begin_ns + 10) is None  # another thread
    point = rx.decode(AT_EV_EVENT, _raw(0, ts=1500, trace=trace, parent=99, name=b"loaded",
                                        payload=b'{"model":"m","v":3,"ok":true}'))
    assert isinstance(point, AppPoint) and dict(point.attributes) == {"model": "m", "v": 3, "ok": True}
    end = rx.decode(AT_EV_EVENT, _raw(2, ts=3000, trace=trace, parent=5, span=99))
    assert isinstance(end, AppSpan)
    assert (end.trace_id, end.span_id, end.parent_span_id, dict(end.attributes)) == (trace, 99, 5, {"size": 4})
    assert end.end_ns - end.start_ns == 2000
    assert store.lookup(7, 8, end.end_ns + 1) is None and store.lookup(7, 8, end.end_ns - 1) == (trace, 99)
    assert rx.decode(AT_EV_EVENT, _raw(2, span=1234)) is None  # end of a span begun before attach
    assert ctx.telemetry.get("otel_ebpf.events.dropped", receiver="apptrace", reason="end_without_begin") == 1
    bad = rx.decode(AT_EV_EVENT, _raw(0, payload=b'{"trunc'))
    assert isinstance(bad, AppPoint) and dict(bad.attributes) == {"app.payload.error": "not JSON"}
    with pytest.raises(ValueError):
        rx.decode(AT_EV_EVENT, _raw(7))
    rx.shutdown()
    rx.shutdown()


def test_store_nesting_bounds_and_late_lookups() -> None:
    tel = Telemetry()
    store = AppContextStore(tel, max_threads=2)
    store.begin(1, 1, 100, 0xA, 1)
    store.begin(1, 1, 200, 0xA, 2)  # nested
    assert store.lookup(1, 1, 250) == (0xA, 2)
    store.end(1, 1, 2, 300)
    assert store.lookup(1, 1, 250) == (0xA, 2)  # closed, still answers for records read late
    assert store.lookup(1, 1, 350) == (0xA, 1)
    assert store.lookup(1, 1, 50) is None
    for i in range(PER_THREAD + 5):
        store.begin(1, 1, 1000 + i, 0xB, 100 + i)
        store.end(1, 1, 100 + i, 1000 + i)
    assert store.lookup(1, 1, 5000) == (0xA, 1)  # the open outer span survives the bound
    store.begin(2, 2, 0, 0xC, 1)
    store.begin(3, 3, 0, 0xD, 1)  # third thread: the least recently begun (1, 1) goes
    assert store.lookup(1, 1, 5000) is None and len(store) == 2
    assert tel.get("otel_ebpf.events.dropped", receiver="apptrace", reason="context_store_full") == 1


def test_processor_spans_in_the_app_trace_and_pass_through() -> None:
    ctx, sink = Context(), ListConsumer()
    proc = AppTraceProcessor(ProcessorConfig(), ctx, sink)
    other = object()
    proc.consume([AppSpan(7, 8, "app", "batch", 10, 20, 0xABC, 0x99, 0x5, (("size", 4),)),
                  AppPoint(7, 8, "app", "loaded", 15, 0xABC, 0x99, (("model", "m"),)),
                  AppPoint(7, 8, "app", "orphan", 16, 0, 0, ()), other])
    span, point, count, orphan, count2, passed = sink.events
    assert isinstance(span, SpanRecord) and (span.name, span.trace_id, span.span_id, span.parent_span_id) == (
        "batch", 0xABC, 0x99, 0x5)
    assert span.attributes == {"app.tracepoint.provider": "app", "thread.id": 8, "app.arg.size": 4}
    assert isinstance(point, SpanRecord) and (point.trace_id, point.parent_span_id) == (0xABC, 0x99)
    assert isinstance(count, MetricRecord) and count.name == "app.tracepoint.fires" and count.value == 1
    assert isinstance(orphan, SpanRecord) and orphan.trace_id is None and orphan.parent_span_id is None
    assert isinstance(count2, MetricRecord) and passed is other


def test_sdk_disabled_path_and_declaration_errors() -> None:
    assert tracepoints.enabled() is False  # nothing attached in a unit test
    tp = tracepoints.Provider("unit")
    probe = tp.probe("loaded", model=str, n=int)
    before = dict(tracepoints.stats)
    calls: list[int] = []
    probe.fire(model="m", n=lambda: calls.append(1) or 1)
    with tp.span("batch", size=lambda: calls.append(2) or 2):
        pass
    assert calls == [] and tracepoints.stats == before  # lazy arguments never computed, nothing fired
    assert probe.enabled is False
    with pytest.raises(ValueError, match="identifiers"):
        tp.probe("bad name")
    with pytest.raises(ValueError, match="identifier"):
        tracepoints.Provider("x;y")
    with pytest.raises(TypeError, match="str, int, float or bool"):
        tp.probe("p", data=list)


def test_sdk_payload_checks_types_and_is_bounded() -> None:
    probe = tracepoints.Provider("unit").probe("p", model=str, n=int, ok=bool, x=float)
    before = tracepoints.stats["dropped_args"]
    data = json.loads(probe._payload({"model": "m" * 500, "n": True, "ok": True, "x": 1.5, "zzz": 1,
                                      "boom": lambda: 1 / 0}))
    assert data == {"model": "m" * tracepoints.MAX_STR, "ok": True, "x": 1.5}  # bool is not an int here
    assert tracepoints.stats["dropped_args"] - before == 3  # n (bool), zzz (undeclared), boom (undeclared)
    many = tracepoints.Provider("unit").probe("q", **{f"a{i}": str for i in range(10)})
    payload = many._payload({f"a{i}": "v" * 60 for i in range(10)})
    assert len(payload) <= tracepoints.MAX_PAYLOAD
    assert json.loads(payload)["_truncated"] is True


def test_open_span_table_is_bounded_oldest_forgotten() -> None:
    ctx = Context()
    rx = apptrace.create(apptrace.Config(max_open_spans=2), ctx, ListConsumer())
    for span in (1, 2, 3):
        rx.decode(AT_EV_EVENT, _raw(1, trace=5, span=span))
    assert ctx.telemetry.get("otel_ebpf.events.dropped", receiver="apptrace", reason="open_span_table_full") == 1
    assert rx.decode(AT_EV_EVENT, _raw(2, span=1)) is None  # forgotten
    assert isinstance(rx.decode(AT_EV_EVENT, _raw(2, span=3)), AppSpan)
