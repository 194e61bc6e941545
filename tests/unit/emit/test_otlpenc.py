"""otel_ebpf.emit._otlpenc (C): the spans it writes are the SDK's bytes; the ones it does not, it hands back.

The reference is ``encode_spans(spans).SerializeToString()`` (the SDK's OTLP exporters' body), as in
test_otlp_proto.py, whose tests go through the C encoder first. Here the C encoder is called alone, so
a batch it hands back (None) cannot hide behind the Python encoder: each test says which batches it
must write itself.
"""
from __future__ import annotations

import sys
from typing import Any

from hypothesis import HealthCheck, given, settings
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceState

from otel_ebpf.emit import otlp_proto
from tests.unit.emit.test_otlp_json import (
    DIRECT_ONLY,
    direct_span,
    direct_spans,
    exactly_encodable,
    generated_spans,
    resources,
    traced_spans,
)
from tests.unit.emit.test_otlp_proto import sdk_bytes


def native(spans: list[ReadableSpan]) -> bytes | None:
    from otel_ebpf.emit import _otlpenc  # type: ignore[attr-defined]

    out: bytes | None = _otlpenc.encode_spans(spans)
    return out


def _has_dict(value: Any) -> bool:
    if isinstance(value, dict):
        return True
    return isinstance(value, (list, tuple)) and any(_has_dict(v) for v in value)


def on_fast_path(span: ReadableSpan) -> bool:
    """What the C encoder must write itself: no trace state and no dict value (it hands those back)."""
    maps = [span.attributes, *(e.attributes for e in span.events), *(lk.attributes for lk in span.links)]
    return (not span.get_span_context().trace_state
            and not any(_has_dict(v) for m in maps if m for v in m.values()))


def test_the_extension_is_built_and_used():
    assert otlp_proto.NATIVE, "otel_ebpf.emit._otlpenc did not build (pip install -e . builds it; needs gcc)"


def test_sdk_made_spans_are_written_by_the_c_encoder_byte_for_byte():
    """Parents, the five kinds, statuses with messages, events, links, dropped counts, every value kind but dicts,
    non-ASCII and control characters, 4 resources (two equal: one group), scopes with versions and attributes."""
    spans = traced_spans()
    assert all(on_fast_path(s) for s in spans)
    assert native(spans) == sdk_bytes(spans)
    for span in spans:
        assert native([span]) == sdk_bytes([span])


def test_directly_built_spans_are_written_or_handed_back():
    spans = direct_spans()
    fast = [s for s in spans if on_fast_path(s)]
    assert len(fast) == len(spans) - 1  # the first has a trace state and dict values
    for span in spans:
        assert native([span]) == (sdk_bytes([span]) if on_fast_path(span) else None)
    assert native(fast) == sdk_bytes(fast)
    assert native(spans) is None  # one span off the fast path: the whole batch goes to Python


def test_values_only_direct_spans_carry_are_written_too():
    """None, bytes, lists, nested arrays, the empty key: what SpanBuilder's spans may hold and the SDK's tracer
    would rewrite."""
    values = {k: v for k, v in DIRECT_ONLY.items() if not _has_dict(v)}
    remote = SpanContext(7, 8, is_remote=True)
    span = direct_span("values", values, resource=resources()[1], scope=InstrumentationScope("x", "1"),
                       parent=remote, events=(Event("e", values, 3),), links=(Link(remote, values),),
                       status=Status(StatusCode.ERROR, "é"))
    deep = direct_span("deep", {"a": ((((1,),),),)}, resource=resources()[0], scope=None)
    assert native([span, deep]) == sdk_bytes([span, deep])


def test_a_batch_of_many_resources_and_scopes_is_grouped_as_the_sdk_groups_it():
    res = resources()
    scopes = [None, InstrumentationScope("a"), InstrumentationScope("a"), InstrumentationScope("b", "2")]
    spans = [direct_span(f"s{i}", {"i": i}, resource=res[(i * 7) % 4], scope=scopes[(i * 3) % 4], span_id=i + 1)
             for i in range(200)]
    assert native(spans) == sdk_bytes(spans)


def test_it_hands_back_what_it_does_not_write():
    res = resources()[0]
    cases = [direct_span("state", {}, resource=res, scope=None, trace_state=TraceState([("k", "v")])),
             direct_span("dict", {"d": {"k": 1}}, resource=res, scope=None),
             direct_span("surrogate", {"s": "\ud800"}, resource=res, scope=None),
             direct_span("int65", {"i": 2**63}, resource=res, scope=None),
             direct_span("object", {"o": object()}, resource=res, scope=None),
             direct_span("negative start", {}, resource=res, scope=None, start=-1),
             direct_span("too deep", {"a": ((((((((((((((((((((((((((((((((((1,),),),),),),),),),),),),),),),),),),),),),),),),),),),),),),),),),)}, resource=res, scope=None)]
    for span in cases:
        assert native([span]) is None, span.name


def test_it_holds_no_reference_it_took():
    spans = traced_spans()
    res, scope = spans[0].resource, spans[0].instrumentation_scope
    before = sys.getrefcount(res), sys.getrefcount(scope)
    for _ in range(50):
        native(spans)
        native(direct_spans())
    assert (sys.getrefcount(res), sys.getrefcount(scope)) == before


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_spans())
def test_generated_spans_are_written_as_the_sdk_encodes_them_or_handed_back(spans):
    out = native(spans)
    if not exactly_encodable(spans):
        assert out is None
    elif all(on_fast_path(s) for s in spans):
        assert out == sdk_bytes(spans)


class _Wrapped:
    """Not a ReadableSpan: only its public attributes (the C encoder reads a ReadableSpan's fields directly)."""

    def __init__(self, span: ReadableSpan) -> None:
        self._span = span

    def __getattr__(self, name: str) -> Any:
        return getattr(self._span, name)


def test_a_span_of_another_class_is_read_through_its_public_attributes():
    spans = traced_spans()
    assert native([_Wrapped(s) for s in spans]) == sdk_bytes(spans)  # type: ignore[misc]
