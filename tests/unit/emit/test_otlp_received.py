"""Spans received over OTLP leave as they came: otlp_in (C and Python) keeps each span's bytes (``RECEIVED_SPAN``),
and the protobuf encoders (C and Python) send them on with the attributes added in place since (the collective join's
``nccl.wait_ns``), where protobuf's own serializer puts an added attribute.

The reference is the official classes: the received request parsed, the attribute added to each span with
``attributes.add``, serialized again. Without the kept bytes (a copy, a key sent twice, a link left out, attributes
no longer the received ones) a span is written from its fields, as the SDK's encoder writes it.
"""
from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope as PbScope
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_ebpf.core.readable import with_changes
from otel_ebpf.emit import otlp_in, otlp_proto
from otel_ebpf.emit.otlp_common import RECEIVED_SPAN
from tests.unit.emit.test_otlp_json import direct_span, direct_spans, resources, traced_spans

Decode = Callable[[ExportTraceServiceRequest], list[Any]]
DECODERS: dict[str, Decode] = {
    "C": lambda request: otlp_in.spans_from_request(request)[0],
    "Python": lambda request: otlp_in._spans_in_python(request)[0],
}
ENCODERS: dict[str, Callable[[list[Any]], bytes]] = {
    "C": otlp_proto.spans_to_otlp_proto,
    "Python": otlp_proto.python_spans_to_otlp_proto,
}
both = pytest.mark.parametrize("dec,enc", [(d, e) for d in DECODERS for e in ENCODERS])


def received_request() -> ExportTraceServiceRequest:
    """Every kind of span the SDK sends (dropped counts included), but a trace state, a span without a scope (it
    comes back with an empty one) and one with invalid ids (left out)."""
    return encode_spans([s for s in [*traced_spans(), *direct_spans()] if not s.get_span_context().trace_state
                         and s.instrumentation_scope is not None and s.get_span_context().is_valid])


def with_added(request: ExportTraceServiceRequest, key: str, value: AnyValue) -> bytes:
    out = ExportTraceServiceRequest.FromString(request.SerializeToString())
    for rs in out.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                span.attributes.append(KeyValue(key=key, value=value))
    return out.SerializeToString()


def test_the_c_extension_is_in_use():
    assert otlp_in.NATIVE


@both
def test_a_received_span_unchanged_leaves_as_the_bytes_it_came_as(dec: str, enc: str):
    request = received_request()
    spans = DECODERS[dec](request)
    assert all(type(s.__dict__.get(RECEIVED_SPAN)) is bytes for s in spans)
    assert ENCODERS[enc](spans) == request.SerializeToString()


@both
def test_a_span_whose_dict_was_never_asked_for_leaves_as_one_whose_dict_was(dec: str, enc: str):
    """The C decoder sets a span's fields as ReadableSpan.__init__ does (on CPython 3.11+ they stay in the
    instance's own values until something asks for ``__dict__``) and the C encoder reads them without asking: both
    kinds of the same span leave as the same bytes."""
    request = received_request()
    untouched, asked = DECODERS[dec](request), DECODERS[dec](request)
    for s in asked:
        assert RECEIVED_SPAN in s.__dict__
    assert ENCODERS[enc](untouched) == ENCODERS[enc](asked) == request.SerializeToString()
    for s in untouched:
        s._attributes["nccl.wait_ns"] = 1
    for s in asked:
        s.__dict__["_attributes"]["nccl.wait_ns"] = 1
    assert ENCODERS[enc](untouched) == ENCODERS[enc](asked) \
        == with_added(request, "nccl.wait_ns", AnyValue(int_value=1))


@both
def test_an_attribute_added_in_place_is_written_where_protobuf_writes_it(dec: str, enc: str):
    request = received_request()
    spans = DECODERS[dec](request)
    for s in spans:
        s._attributes["nccl.wait_ns"] = 12345
    assert ENCODERS[enc](spans) == with_added(request, "nccl.wait_ns", AnyValue(int_value=12345))


@both
def test_bytes_in_another_field_order_keep_it_and_gain_the_attribute_after_the_received_ones(dec: str, enc: str):
    """Status (15) before the attributes, a dropped count (10), an unknown field: sent on, as a collector forwards
    what it does not read (the C decoder keeps the bytes as they came, the Python one as protobuf serializes them)."""
    head = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="odd").SerializeToString()
    status = Span(status={"code": 2, "message": "bad"}).SerializeToString()
    attr = Span(attributes=[KeyValue(key="a", value=AnyValue(string_value="x"))]).SerializeToString()
    dropped = Span(dropped_attributes_count=3).SerializeToString()
    unknown = b"\xa8\x06\x07"  # field 101, varint 7
    body = head + status + attr + dropped + unknown
    scope_spans = field(1, PbScope(name="s").SerializeToString()) + field(2, body)  # scope {name: "s"}, the span
    raw = field(1, field(2, scope_spans))  # one ResourceSpans without a resource
    parsed = ExportTraceServiceRequest.FromString(raw)
    spans = otlp_in.spans_from_request(parsed, raw)[0] if dec == "C" else DECODERS[dec](parsed)
    spans[0]._attributes["w"] = 1
    sent = ENCODERS[enc](spans)
    got = ExportTraceServiceRequest.FromString(sent).resource_spans[0].scope_spans[0].spans[0]
    assert [(kv.key, kv.value) for kv in got.attributes] == [("a", AnyValue(string_value="x")),
                                                             ("w", AnyValue(int_value=1))]
    assert (got.dropped_attributes_count, got.status.message, got.name) == (3, "bad", "odd")
    assert unknown in sent
    added = Span(attributes=[KeyValue(key="w", value=AnyValue(int_value=1))]).SerializeToString()
    if dec == "C":
        assert head + status + attr + added + dropped + unknown in sent


def field(number: int, body: bytes) -> bytes:
    assert len(body) < 128
    return bytes([number << 3 | 2, len(body)]) + body


def sdk_bytes(spans: list[Any]) -> bytes:
    return encode_spans([with_changes(s, dict(s._attributes)) for s in spans]).SerializeToString()


@both
def test_a_copy_does_not_carry_the_bytes_and_is_written_from_its_fields(dec: str, enc: str):
    spans = DECODERS[dec](received_request())
    copies = [with_changes(s, {**s._attributes, "k": "v"}) for s in spans]
    assert all(RECEIVED_SPAN not in c.__dict__ for c in copies)
    assert ENCODERS[enc](copies) == encode_spans(copies).SerializeToString()


@both
def test_attributes_fewer_than_received_or_not_a_dict_are_written_from_the_fields(dec: str, enc: str):
    """What the encoder can tell: a span's bytes are its own while its own dict holds at least the attributes it came
    with (otel_ebpf.emit.otlp_common.RECEIVED_SPAN: a received span only gains attributes in place)."""
    spans = [s for s in DECODERS[dec](received_request()) if s._attributes]
    assert len(spans) > 5
    for i, s in enumerate(spans):
        s._attributes = {} if i % 2 else MappingProxyType(dict(s._attributes))
    assert ENCODERS[enc](spans) == sdk_bytes(spans)


@pytest.mark.parametrize("dec", DECODERS)
def test_a_key_sent_twice_or_a_link_left_out_keeps_no_bytes(dec: str):
    res = resources()[0]
    request = encode_spans([direct_span(f"s{i}", {"i": i}, resource=res, scope=None, span_id=i + 1)
                            for i in range(3)])
    pb = request.resource_spans[0].scope_spans[0].spans
    pb[0].attributes.add(key="i", value=AnyValue(int_value=9))
    pb[1].links.add(trace_id=b"\x01" * 3, span_id=b"\x02" * 8)
    spans = DECODERS[dec](request)
    assert [RECEIVED_SPAN in s.__dict__ for s in spans] == [False, False, True]
    assert spans[0]._attributes == {"i": 9} and spans[1].links == ()
    assert ExportTraceServiceRequest.FromString(otlp_proto.spans_to_otlp_proto(spans)) \
        == ExportTraceServiceRequest.FromString(sdk_bytes(spans))
