"""Span items (otel_ebpf.emit.spans.SpanItem): the emitter queues records, not SDK spans (issue 19), and the C
encoders write an item exactly as the SDK writes the ReadableSpan made of it (``readable``): protobuf against the
SDK's ``encode_spans(...).SerializeToString()``, OTLP/JSON against ``to_otlp_json(encode_spans(...))``. A batch
may mix items and SDK spans (the gateway forwards SDK spans on the same queues). What the C path does not write
comes back as None, and the exporters then write the SDK spans made of the items."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_ebpf.core.events import SpanEventRecord, SpanLinkRecord, SpanRecord
from otel_ebpf.emit.jsonfile import JsonLinesSpanExporter
from otel_ebpf.emit.otlp_json import spans_to_otlp_json
from otel_ebpf.emit.otlp_proto import spans_to_otlp_proto
from otel_ebpf.emit.spans import SpanBuilder, readable, readable_spans
from tests.unit.emit.test_otlp_json import _TEXT, _VALUE, MAX_U64, STRINGS, VALUES, _exact, old_line, resources
from tests.unit.emit.test_otlp_proto import sdk_bytes
from tests.unit.emit.test_otlpenc import native

FORMATS = ["proto", "json"]
T0 = 1_764_650_000_000_000_000
KINDS = ["internal", "client", "server", "producer", "consumer"]


def reference(items: list[Any], fmt: str) -> bytes | str:
    spans = readable_spans(items)
    return sdk_bytes(spans) if fmt == "proto" else old_line(spans)


def records() -> list[SpanRecord]:
    """Every shape a processor makes: parents or not, errors, events, links, every kind, arrays, non-ASCII, empty
    names and strings, an end before the start, a zero start, ids given or drawn."""
    out = []
    for i, kind in enumerate(KINDS):
        out.append(SpanRecord(42, STRINGS[i % len(STRINGS)], T0 + i, T0 + i + 5000, dict(VALUES), kind=kind,
                              scope="otel_ebpf.cuda" if i % 2 else "otel_ebpf.nccl"))
    out += [
        SpanRecord(42, "child", T0, T0 + 10, {"cuda.api": "cudaMemcpy"}, trace_id=7, parent_span_id=9),
        SpanRecord(42, "ids", T0, T0 + 10, {}, trace_id=2**128 - 1, span_id=MAX_U64, parent_span_id=0),
        SpanRecord(42, "failed", T0, T0 + 10, {"error.type": "cudaErrorInvalidValue"}, error="invalid argument"),
        SpanRecord(42, "failed, no message", T0, T0 + 10, {}, error=""),
        SpanRecord(42, "ends first", T0 + 100, T0, {"a": 1}),
        SpanRecord(42, "", 0, 0, {}),
        SpanRecord(42, "nccl:AllReduce", T0, T0 + 10, {"nccl.rank": 3}, kind="client",
                   events=(SpanEventRecord("nccl.straggler.persistent", T0 + 5, {"nccl.rank.late": 1}),
                           SpanEventRecord("é", 0, {}), SpanEventRecord("", T0, dict(VALUES))),
                   links=(SpanLinkRecord(11, 12, {"nccl.link": "recv"}), SpanLinkRecord(2**128 - 1, MAX_U64, {}))),
    ]
    return out


def items(recs: list[SpanRecord] | None = None) -> list[Any]:
    b = SpanBuilder()
    res = resources()
    return [b.item(r, res[i % len(res)]) for i, r in enumerate(recs if recs is not None else records())]


@pytest.mark.parametrize("fmt", FORMATS)
def test_items_are_written_as_the_sdk_writes_their_spans(fmt: str) -> None:
    batch = items()
    out = native(batch, fmt)
    assert out is not None, "the C encoder handed back a batch it must write"
    assert out == reference(batch, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_of_items_and_sdk_spans_is_one_request_grouped_as_the_sdk_groups_it(fmt: str) -> None:
    batch = items()
    mixed = [x if i % 2 else readable(x) for i, x in enumerate(batch)]
    assert native(mixed, fmt) == reference(batch, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_items_the_c_path_does_not_write_are_handed_back_and_written_from_their_spans(fmt: str) -> None:
    """An attribute mapping that is not a dict, a dict value, an integer out of int64: the C path hands the batch
    back, and spans_to_otlp_proto / spans_to_otlp_json write the SDK spans made of it (or refuse what the SDK
    refuses)."""
    from types import MappingProxyType

    odd = items([SpanRecord(42, "proxy", T0, T0 + 1, MappingProxyType({"a": 1})),  # type: ignore[arg-type]
                 SpanRecord(42, "dict value", T0, T0 + 1, {"d": {"k": 1}}),
                 SpanRecord(42, "event proxy", T0, T0 + 1, {},
                            events=(SpanEventRecord("e", T0, MappingProxyType({"a": 1})),))])  # type: ignore[arg-type]
    for one in odd:
        assert native([one], fmt) is None
    write = spans_to_otlp_proto if fmt == "proto" else spans_to_otlp_json
    assert write([odd[0]]) == reference([odd[0]], fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_unknown_kind_is_refused_before_it_is_queued(fmt: str) -> None:
    with pytest.raises(KeyError):
        SpanBuilder().item(SpanRecord(42, "x", T0, T0 + 1, {}, kind="sideways"), Resource({}))  # type: ignore[arg-type]


def test_ids_are_drawn_once_per_item_and_kept_by_its_span() -> None:
    b = SpanBuilder()
    rec = SpanRecord(42, "x", T0, T0 + 1, {})
    item = b.item(rec, Resource({}))
    assert item[3] and item[4] and item[3] < 2**128 and item[4] < 2**64
    span = readable(item)
    assert (span.context.trace_id, span.context.span_id) == (item[3], item[4])
    assert readable(item).context == span.context  # every exporter writes the same span
    given = b.item(SpanRecord(42, "x", T0, T0 + 1, {}, trace_id=5, span_id=6), Resource({}))
    assert given[3:] == (5, 6)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generated_items_are_written_as_the_sdk_writes_them_or_handed_back(data: st.DataObject) -> None:
    recs = []
    for _ in range(data.draw(st.integers(1, 4))):
        attrs = data.draw(st.dictionaries(_TEXT, _VALUE, max_size=6))
        events = tuple(SpanEventRecord(data.draw(_TEXT), data.draw(st.integers(0, MAX_U64)),
                                       data.draw(st.dictionaries(_TEXT, _VALUE, max_size=2)))
                       for _ in range(data.draw(st.integers(0, 2))))
        links = tuple(SpanLinkRecord(data.draw(st.integers(0, 2**128 - 1)), data.draw(st.integers(0, MAX_U64)),
                                     data.draw(st.dictionaries(_TEXT, _VALUE, max_size=2)))
                      for _ in range(data.draw(st.integers(0, 2))))
        start = data.draw(st.integers(0, MAX_U64))
        recs.append(SpanRecord(42, data.draw(_TEXT), start, data.draw(st.integers(0, MAX_U64)), attrs,
                               kind=data.draw(st.sampled_from(KINDS)), events=events, links=links,
                               error=data.draw(st.one_of(st.none(), _TEXT)),
                               parent_span_id=data.draw(st.one_of(st.none(), st.integers(0, MAX_U64))),
                               trace_id=data.draw(st.one_of(st.none(), st.integers(1, 2**128 - 1)))))
    batch = items(recs)
    exact = all(_exact(r.name) and (r.error is None or _exact(r.error))
                and all(_exact(k) and _exact(v) for m in (r.attributes, *(e.attributes for e in r.events),
                                                          *(lk.attributes for lk in r.links)) for k, v in m.items())
                and all(_exact(e.name) for e in r.events) for r in recs)
    for fmt in FORMATS:
        out = native(batch, fmt)
        if exact:
            assert out == reference(batch, fmt)
        else:
            assert out is None or out == reference(batch, fmt)


def test_the_emitter_queues_items_and_an_sdk_exporter_gets_their_spans() -> None:
    """Exporters of our own (file, OTLP) take the items; any other SDK exporter gets the ReadableSpans."""
    from tests.unit.emit.test_emitter import Rig

    rig = Rig()
    try:
        recs = records()
        rig.emitter.consume(recs)
        got = rig.finished()
        assert [s.name for s in got] == [r.name for r in recs]
        assert all(isinstance(s, ReadableSpan) for s in got)
        assert [s.attributes for s in got] == [r.attributes for r in recs]
    finally:
        rig.emitter.shutdown()


def test_the_file_exporter_writes_items_as_the_sdk_writes_their_spans(tmp_path: Any) -> None:
    exporter = JsonLinesSpanExporter(tmp_path)
    batch = items()
    assert exporter.export(batch) == SpanExportResult.SUCCESS
    assert exporter.fallbacks == 0
    assert (tmp_path / "traces.jsonl").read_text() == reference(batch, "json") + "\n"
