"""otel_ebpf.emit.otlp_json: the direct OTLP/JSON encoder writes the bytes the SDK + json_format path writes.

The reference is the file exporter's former line, ``to_otlp_json(encode_spans(spans))`` (and
``encode_logs``): every comparison here is of the two strings, byte for byte.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry._logs import LogRecord as SdkLogRecord
from opentelemetry.attributes import BoundedAttributes
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from otel_ebpf.core.events import LogRecord
from otel_ebpf.core.otlpjson import parse_otlp_json, to_otlp_json
from otel_ebpf.emit.jsonfile import JsonLinesLogExporter, JsonLinesSpanExporter
from otel_ebpf.emit.logs import LogBuilder
from otel_ebpf.emit import otlp_json
from otel_ebpf.emit.otlp_json import Unencodable, logs_to_otlp_json, spans_to_otlp_json

MAX_U64 = 2**64 - 1
STRINGS = ["", "plain", "é ü ß", "日本語", "emoji \U0001f680", "quote \" backslash \\ slash /",
           "ctl \x00\x01\x1f\x7f \t\n\r\b\f", "seps \u2028\u2029 bom \ufeff", "nbsp\xa0"]
VALUES: dict[str, Any] = {
    "s": "x", "s.empty": "", "s.nonascii": "µs ✓", "s.ctl": "a\x00b\nc",
    "b.t": True, "b.f": False,
    "i.0": 0, "i.neg": -1, "i.min": -2**63, "i.max": 2**63 - 1, "i.big": 10**18,
    "f.0": 0.0, "f.neg0": -0.0, "f.int": 3.0, "f.tenth": 0.1, "f.big": 1e300, "f.tiny": 5e-324, "f.e16": 1e16,
    "f.nan": math.nan, "f.inf": math.inf, "f.ninf": -math.inf,
    "a.s": ("a", "", "é"), "a.b": (True, False), "a.i": (0, -2**63, 2**63 - 1), "a.f": (1.0, math.nan, -0.5),
    "a.empty": (), "a.none": ("a", None),
}
DIRECT_ONLY: dict[str, Any] = {  # values the SDK's tracer refuses or rewrites; a span built directly keeps them
    "none": None, "bytes": b"\x00\xff\xfe", "bytes.empty": b"", "list": [1, 2], "dict": {"k": [1, "a"], 2: {}},
    "dict.empty": {}, "nested": [[1], ["a"]], "": "empty key",
}


def resources() -> list[Resource]:
    return [Resource({"service.name": "train", "process.pid": 42}),
            Resource({"service.name": "train", "host.name": "é"}, schema_url="https://opentelemetry.io/schemas/1.21.0"),
            Resource({}),
            Resource({"service.name": "train", "process.pid": 42})]  # equal to the first: the same group


def traced_spans() -> list[ReadableSpan]:
    """Spans made by the SDK's own tracer: parents, kinds, statuses, events, links, limits (dropped counts)."""
    res = resources()
    spans: list[ReadableSpan] = []
    limits = SpanLimits(max_span_attributes=len(VALUES) - 1, max_events=2, max_links=2, max_event_attributes=3,
                        max_link_attributes=3)
    for n, resource in enumerate(res):
        provider = TracerProvider(resource=resource, span_limits=limits)
        mem = InMemorySpanExporter()  # one each: a provider's shutdown stops its exporter
        provider.add_span_processor(SimpleSpanProcessor(mem))
        tracers = [provider.get_tracer("otel_ebpf.cuda"),
                   provider.get_tracer("otel_ebpf.nccl", "1.2.3", schema_url="https://example.com/s",
                                       attributes={"scope.attr": "v", "n": 1}),
                   provider.get_tracer("")]
        for t, tracer in enumerate(tracers):
            kind = list(SpanKind)[(n + t) % len(SpanKind)]
            with tracer.start_as_current_span(f"root {n}.{t}", kind=kind, start_time=1, end_on_exit=False) as root:
                child = tracer.start_span("" if t == 2 else STRINGS[(n + t) % len(STRINGS)], kind=SpanKind.CLIENT,
                                          start_time=10**18 + n, attributes=VALUES,
                                          links=[Link(root.get_span_context(), {"why": "peer", "a": 1, "b": 2,
                                                                                "c": 3}),
                                                 Link(root.get_span_context()), Link(root.get_span_context())])
                for e in range(3):
                    child.add_event(STRINGS[e], {"n": e, "f": e / 3, "s": STRINGS[-e], "x": 1} if e else None,
                                    timestamp=MAX_U64 - e)
                child.set_status(Status(StatusCode.ERROR, STRINGS[(n + t + 4) % len(STRINGS)] or "err"))
                child.end(end_time=MAX_U64)
                root.set_status(Status(StatusCode.OK) if t == 1 else Status(StatusCode.UNSET))
                root.end(end_time=2)
        provider.shutdown()
        spans += mem.get_finished_spans()
    return spans


def direct_span(name: str, attributes: Any, *, resource: Resource, scope: InstrumentationScope | None,
                parent: SpanContext | None = None, trace_id: int = 0x0123456789ABCDEF0123456789ABCDEF,
                span_id: int = 0x1122334455667788, trace_state: TraceState | None = None,
                start: int | None = 5, end: int | None = 9, events: tuple[Event, ...] = (),
                links: tuple[Link, ...] = (), status: Status | None = None) -> ReadableSpan:
    """A ReadableSpan built directly, as otel_ebpf.emit.spans.SpanBuilder builds them."""
    context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1), trace_state=trace_state)
    return ReadableSpan(name=name, context=context, parent=parent, resource=resource, attributes=attributes,
                        events=events, links=links, kind=SpanKind.INTERNAL,
                        status=status or Status(StatusCode.UNSET), start_time=start, end_time=end,
                        instrumentation_scope=scope)


def direct_spans() -> list[ReadableSpan]:
    res = resources()
    scope = InstrumentationScope("otel_ebpf.python")
    remote = SpanContext(7, 8, is_remote=True, trace_flags=TraceFlags(1))
    local = SpanContext(7, 9, is_remote=False)
    return [
        direct_span("direct", {**VALUES, **DIRECT_ONLY}, resource=res[0], scope=scope, parent=remote,
                    trace_state=TraceState([("vendor", "v1"), ("other", "x-y")]),
                    events=(Event("e", DIRECT_ONLY, 0), Event("", None, 3)),
                    links=(Link(remote, DIRECT_ONLY), Link(local),
                           Link(local, BoundedAttributes(1, {"a": 1, "b": 2})))),
        direct_span("zero ids and times", None, resource=res[2], scope=None, parent=local, trace_id=0, span_id=0,
                    start=0, end=0, trace_state=TraceState()),
        direct_span("no times", {}, resource=res[3], scope=scope, start=None, end=None,
                    status=Status(StatusCode.ERROR)),
        direct_span("max ids", {"k": "v"}, resource=res[1], scope=InstrumentationScope("s", "", None),
                    trace_id=2**128 - 1, span_id=MAX_U64, start=MAX_U64, end=MAX_U64),
        direct_span("start only", {"k": 1}, resource=res[1], scope=None, start=1, end=0),
        direct_span("end only", {"k": 1.5}, resource=res[1], scope=None, start=None, end=1),
    ]


def old_line(spans: list[ReadableSpan]) -> str:
    return to_otlp_json(encode_spans(spans))


def test_spans_are_written_byte_for_byte_as_the_sdk_path_writes_them():
    spans = traced_spans() + direct_spans()
    assert len(spans) == 4 * 3 * 2 + 6
    line = spans_to_otlp_json(spans)
    assert line == old_line(spans)
    for span in spans:  # and each alone: its own resource and scope blocks
        assert spans_to_otlp_json([span]) == old_line([span])


def test_the_batch_has_what_the_cases_are_meant_to_cover():
    """Guards the cases above: a change to the SDK (or to them) that drops one fails here."""
    spans = traced_spans() + direct_spans()
    request = parse_otlp_json(spans_to_otlp_json(spans), ExportTraceServiceRequest)
    assert len(request.resource_spans) == 3  # 4 resources, two of them equal
    all_spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(all_spans) == len(spans)
    assert {s.kind for s in all_spans} == {1, 2, 3, 4, 5}
    assert {s.status.code for s in all_spans} == {0, 1, 2}
    assert {s.flags for s in all_spans} == {256, 768}
    assert any(s.dropped_attributes_count == 1 and s.dropped_events_count == 1 and s.dropped_links_count == 1
               for s in all_spans)
    assert any(e.dropped_attributes_count == 1 for s in all_spans for e in s.events)
    assert any(lk.dropped_attributes_count == 1 for s in all_spans for lk in s.links)
    assert any(s.trace_state == "vendor=v1,other=x-y" for s in all_spans)
    assert {s.end_time_unix_nano for s in all_spans} >= {0, MAX_U64}
    kinds = {kv.value.WhichOneof("value") for s in all_spans for kv in s.attributes}
    assert kinds == {"string_value", "bool_value", "int_value", "double_value", "array_value", "bytes_value",
                     "kvlist_value", None}


def test_the_line_parses_back_with_the_proto_classes_to_the_sdk_encoding():
    spans = [s for s in traced_spans() + direct_spans() if not _has_nan(s)]  # NaN != NaN in message equality
    assert spans
    assert parse_otlp_json(spans_to_otlp_json(spans), ExportTraceServiceRequest) == encode_spans(spans)


def _has_nan(span: ReadableSpan) -> bool:
    return "f.nan" in (span.attributes or {})


def test_more_distinct_keys_than_the_key_cache_holds_are_written_alike():
    attributes = {f"key.{i}": i for i in range(5000)}  # the cache of escaped keys starts over at 4096
    spans = [direct_span("many", attributes, resource=resources()[0], scope=None)] * 2
    assert spans_to_otlp_json(spans) == old_line(spans)
    assert len(otlp_json._HEADS) <= otlp_json._HEADS_MAX  # bounded: an agent meets keys without end (argv...)


def test_an_empty_batch_is_the_empty_request():
    assert spans_to_otlp_json([]) == old_line([]) == "{}"
    assert logs_to_otlp_json([]) == to_otlp_json(encode_logs([])) == "{}"


REFUSED = [2**63, -2**63 - 1, "lone \ud800 surrogate", object(), {1, 2}, (1, object()), bytearray(b"x"), 1 + 2j]
REFUSED_IDS = ["int64+1", "int64-1", "surrogate", "object", "set", "array of object", "bytearray", "complex"]


@pytest.mark.parametrize("value", REFUSED, ids=REFUSED_IDS)
def test_a_value_it_cannot_write_exactly_is_refused_and_the_exporter_writes_the_sdk_line(value, tmp_path, caplog):
    res = resources()
    good = direct_span("good", {"a": 1}, resource=res[0], scope=None)
    bad = direct_span("bad", {"ok": 1, "refused": value}, resource=res[0], scope=None)
    with pytest.raises(Unencodable):
        spans_to_otlp_json([good, bad])
    exporter = JsonLinesSpanExporter(tmp_path)
    with caplog.at_level(logging.INFO, logger="otel_ebpf.emit.jsonfile"):
        exporter.export([good, bad])
        exporter.export([good, bad])
        exporter.export([good])
    assert exporter.fallbacks == 2
    ours = [r.getMessage() for r in caplog.records if r.name == "otel_ebpf.emit.jsonfile"]
    assert len(ours) == 1 and "cannot write exactly" in ours[0]  # said once
    lines = (tmp_path / "traces.jsonl").read_text().splitlines()
    assert lines == [old_line([good, bad])] * 2 + [old_line([good])]
    if not isinstance(value, bytearray):  # the SDK path writes a bytearray as an array of ints, drops the rest
        assert '"refused"' not in lines[0] and '"ok"' in lines[0]


@pytest.mark.parametrize("case", ["name", "start", "trace id", "kind", "dropped count"])
def test_a_span_the_sdk_path_cannot_encode_is_refused_too(case):
    span = direct_span("s", {}, resource=resources()[0], scope=None)
    attributes = BoundedAttributes(1, {"a": 1})
    attributes.dropped = 2**32  # past uint32
    bad = {"dropped count": lambda: setattr(span, "_attributes", attributes),
           "name": lambda: setattr(span, "_name", "\udcff"), "start": lambda: setattr(span, "_start_time", -1),
           "trace id": lambda: setattr(span, "_context", SpanContext(2**128, 1, False)),
           "kind": lambda: setattr(span, "_kind", "client")}
    bad[case]()
    with pytest.raises(Unencodable):
        spans_to_otlp_json([span])
    with pytest.raises(Exception):  # noqa: B017  # what the exporter falls back to fails as well
        encode_spans([span])


# --- log records ---------------------------------------------------------------------------------------

def log_records() -> list[ReadableLogRecord]:
    res = resources()
    build = LogBuilder().build
    made = [build(LogRecord(pid=42, time_ns=10**18, event_name="otel_ebpf.nccl.rank.stack", body=STRINGS[6],
                            attributes=VALUES, severity="WARN", scope="otel_ebpf.hang",
                            trace_id=0x0123456789ABCDEF0123456789ABCDEF, span_id=0x1122334455667788), res[0]),
            build(LogRecord(pid=None, time_ns=MAX_U64, event_name="", body="", attributes={}, severity="FATAL"),
                  res[1]),
            build(LogRecord(pid=1, time_ns=0, event_name="e", body="é", attributes={"k": "v"}, severity="TRACE",
                            scope="otel_ebpf.hang"), res[3])]
    scope = InstrumentationScope("raw", "0.1", "https://example.com/s", {"a": 1})
    for body in (None, {"k": [1, 2.5, None], "n": {"b": b"\x01"}}, [1, "a"], 7, 1.5, True, b"\xff"):
        record = SdkLogRecord(timestamp=None, observed_timestamp=1, body=body, severity_text=None,
                              severity_number=None, attributes={"x": body} if body is not None else None)
        made.append(ReadableLogRecord(record, res[2], scope))
    made.append(ReadableLogRecord(SdkLogRecord(timestamp=3, body="b", severity_number=SeverityNumber.INFO4,
                                               trace_id=2**128 - 1, span_id=MAX_U64, trace_flags=TraceFlags(0)),
                                  res[0], None))
    return made


def test_log_records_are_written_byte_for_byte_as_the_sdk_path_writes_them():
    records = log_records()
    assert logs_to_otlp_json(records) == to_otlp_json(encode_logs(records))
    for record in records:
        assert logs_to_otlp_json([record]) == to_otlp_json(encode_logs([record]))
    parsed = parse_otlp_json(logs_to_otlp_json(records), ExportLogsServiceRequest)
    assert len(parsed.resource_logs) == 3
    assert {r.body.WhichOneof("value") for rl in parsed.resource_logs for sl in rl.scope_logs
            for r in sl.log_records} == {"string_value", "kvlist_value", "array_value", "int_value", "double_value",
                                          "bool_value", "bytes_value", None}


def test_the_log_exporter_falls_back_for_a_record_it_cannot_write(tmp_path):
    records = log_records()[:1]
    bad = ReadableLogRecord(SdkLogRecord(timestamp=3, body="b", attributes={"big": 2**64}), resources()[0], None)
    with pytest.raises(Unencodable):
        logs_to_otlp_json([*records, bad])
    exporter = JsonLinesLogExporter(tmp_path)
    exporter.export([*records, bad])
    exporter.export(records)
    assert exporter.fallbacks == 1
    assert (tmp_path / "logs.jsonl").read_text().splitlines() == [to_otlp_json(encode_logs([*records, bad])),
                                                                   to_otlp_json(encode_logs(records))]


# --- generated spans -----------------------------------------------------------------------------------

_TEXT = st.text(st.characters(codec=None), max_size=12)  # surrogates included: some must be refused
_SCALARS = st.one_of(_TEXT, st.booleans(), st.integers(-2**64, 2**64), st.floats(allow_nan=True, allow_infinity=True))
_VALUE = st.one_of(_SCALARS, st.lists(st.text(max_size=4), max_size=3).map(tuple),
                   st.lists(st.integers(-2**63, 2**63 - 1), max_size=3).map(tuple),
                   st.lists(st.floats(), max_size=3).map(tuple), st.lists(st.booleans(), max_size=3).map(tuple))


def _exact(value: Any) -> bool:
    """Whether the SDK path encodes ``value`` without an error: the encoder's domain."""
    if isinstance(value, str):
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return -2**63 <= value < 2**63
    return all(_exact(v) for v in value) if isinstance(value, tuple) else True


@st.composite
def generated_spans(draw: st.DrawFn) -> list[ReadableSpan]:
    res = resources()
    scopes = [None, InstrumentationScope("a"), InstrumentationScope("b", "1", None, {"k": "v"})]
    spans = []
    for i in range(draw(st.integers(1, 4))):
        attributes = draw(st.dictionaries(_TEXT, _VALUE, max_size=6))
        events = tuple(Event(draw(_TEXT), draw(st.dictionaries(_TEXT, _VALUE, max_size=2)),
                             draw(st.integers(0, MAX_U64))) for _ in range(draw(st.integers(0, 2))))
        parent = draw(st.sampled_from([None, SpanContext(1, 2, True), SpanContext(1, 3, False)]))
        spans.append(direct_span(draw(_TEXT), attributes, resource=draw(st.sampled_from(res)),
                                 scope=draw(st.sampled_from(scopes)), parent=parent,
                                 trace_id=draw(st.integers(0, 2**128 - 1)), span_id=draw(st.integers(0, MAX_U64)),
                                 start=draw(st.integers(0, MAX_U64)), end=draw(st.integers(0, MAX_U64)),
                                 events=events, status=Status(StatusCode.ERROR, draw(_TEXT)) if i % 2 else None))
    return spans


def exactly_encodable(spans: list[ReadableSpan]) -> bool:
    """Whether the SDK path encodes every one of generated ``spans`` without an error."""
    return all(_exact(span.name) and (span.status.description is None or _exact(span.status.description))
               and all(_exact(k) and _exact(v) for k, v in span.attributes.items())
               and all(_exact(e.name) and all(_exact(k) and _exact(v) for k, v in e.attributes.items())
                       for e in span.events)
               for span in spans)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_spans())
def test_generated_spans_are_written_as_the_sdk_path_writes_them_or_refused(spans):
    if exactly_encodable(spans):
        assert spans_to_otlp_json(spans) == old_line(spans)
    else:
        with pytest.raises(Unencodable):
            spans_to_otlp_json(spans)
