"""otel_ebpf.emit.spans.SpanBuilder: the span it writes field by field is the one the SDK's constructors make.

The reference is ``ReadableSpan(...)`` with ``SpanContext(...)``, ``Event``, ``Link`` and ``Status`` built through
their own constructors from the same record and ids (what SpanBuilder did before it wrote the fields itself);
compared are the instances' fields and the bytes the SDK's encoder writes of them.
"""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from otel_ebpf.core.events import SpanEventRecord, SpanLinkRecord, SpanRecord
from otel_ebpf.emit.otlp_proto import spans_to_otlp_proto
from otel_ebpf.emit.spans import SpanBuilder

_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER,
          "producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER}
RESOURCE = Resource.create({"process.pid": 7, "host.name": "n0"})


def constructed(rec: SpanRecord, trace_id: int, span_id: int) -> ReadableSpan:
    """The span of ``rec`` through the SDK's and API's constructors."""
    flags = TraceFlags(TraceFlags.SAMPLED)
    parent = (SpanContext(trace_id, rec.parent_span_id, is_remote=True, trace_flags=flags)
              if rec.parent_span_id is not None else None)
    return ReadableSpan(
        name=rec.name, context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags), parent=parent,
        resource=RESOURCE, attributes=rec.attributes,
        events=[Event(e.name, e.attributes, e.time_ns) for e in rec.events],
        links=[Link(SpanContext(lk.trace_id, lk.span_id, is_remote=True, trace_flags=flags), lk.attributes)
               for lk in rec.links],
        kind=_KINDS[rec.kind], status=Status(StatusCode.UNSET) if rec.error is None else Status(StatusCode.ERROR,
                                                                                                  rec.error),
        start_time=rec.start_ns, end_time=max(rec.end_ns, rec.start_ns),
        instrumentation_scope=InstrumentationScope(rec.scope))


def fields(span: ReadableSpan) -> dict[str, Any]:
    """The instance's fields, with the objects that compare by identity (events, links, status, scope) opened."""
    out = dict(vars(span))
    out["_events"] = [(type(e), vars(e)) for e in span._events]
    out["_links"] = [(type(lk), lk.context, lk.attributes) for lk in span._links]
    out["_status"] = (span._status.status_code, span._status.description)
    out["_context"] = (type(span._context), tuple(span._context))
    out["_parent"] = None if span._parent is None else (type(span._parent), tuple(span._parent))
    return out


ids = st.integers(min_value=1, max_value=2**64 - 1)
int64 = st.integers(-2**63, 2**63 - 1)  # what an OTLP int value holds
records = st.builds(
    SpanRecord, pid=st.just(7), name=st.text(max_size=8), start_ns=st.integers(0, 2**63),
    end_ns=st.integers(0, 2**63), attributes=st.dictionaries(st.text(max_size=4), int64 | st.text(max_size=4),
                                                            max_size=3),
    scope=st.sampled_from(["otel_ebpf.cuda", "otel_ebpf.nccl"]), kind=st.sampled_from(sorted(_KINDS)),
    trace_id=st.none() | st.integers(1, 2**128 - 1), span_id=st.none() | ids, parent_span_id=st.none() | ids,
    error=st.none() | st.text(max_size=6),
    events=st.lists(st.builds(SpanEventRecord, st.text(max_size=4), st.integers(1, 2**63),
                              st.dictionaries(st.text(max_size=3), st.booleans(), max_size=2)), max_size=2).map(tuple),
    links=st.lists(st.builds(SpanLinkRecord, st.integers(1, 2**128 - 1), ids,
                             st.dictionaries(st.text(max_size=3), int64, max_size=2)), max_size=2).map(tuple))


@settings(max_examples=300, derandomize=True, deadline=None)
@given(records)
def test_a_built_span_has_the_fields_and_bytes_of_the_constructed_one(rec: SpanRecord):
    span = SpanBuilder().build(rec, RESOURCE)
    assert type(span) is ReadableSpan
    ctx = span.get_span_context()
    if rec.trace_id is not None:
        assert ctx.trace_id == rec.trace_id
    if rec.span_id is not None:
        assert ctx.span_id == rec.span_id
    ref = constructed(rec, ctx.trace_id, ctx.span_id)
    assert fields(span) == fields(ref)
    assert encode_spans([span]).SerializeToString() == encode_spans([ref]).SerializeToString()
    assert spans_to_otlp_proto([span]) == encode_spans([ref]).SerializeToString()
    assert span.to_json() == ref.to_json()


def test_ids_out_of_range_make_an_invalid_context_as_the_api_does():
    rec = SpanRecord(7, "x", 1, 2, {}, trace_id=2**128, span_id=5, parent_span_id=0)
    span = SpanBuilder().build(rec, RESOURCE)
    ref = constructed(rec, 2**128, 5)
    assert not span.context.is_valid and fields(span) == fields(ref)
    assert span.parent is not None and not span.parent.is_valid


def test_records_without_ids_get_fresh_random_ones_and_one_scope_object_per_name():
    b = SpanBuilder()
    spans = [b.build(SpanRecord(7, "x", 1, 2, {}, scope="s"), RESOURCE) for _ in range(200)]
    trace_ids = {s.context.trace_id for s in spans}
    span_ids = {s.context.span_id for s in spans}
    assert len(trace_ids) == len(span_ids) == 200
    assert all(0 < t < 2**128 for t in trace_ids) and all(0 < s < 2**64 for s in span_ids)
    assert any(t >= 2**127 for t in trace_ids) and any(s >= 2**63 for s in span_ids)  # all the bits are drawn
    assert len({id(s.instrumentation_scope) for s in spans}) == 1


def test_an_unknown_kind_raises_key_error():
    import pytest

    with pytest.raises(KeyError):
        SpanBuilder().build(SpanRecord(7, "x", 1, 2, {}, kind="sideways"), RESOURCE)  # type: ignore[arg-type]
