"""otel_ebpf.emit._otlpenc (C): the spans it writes are the SDK's bytes; the ones it does not, it hands back.

Both formats: protobuf, against ``encode_spans(spans).SerializeToString()`` (the SDK's OTLP exporters'
body, as test_otlp_proto.py), and OTLP/JSON, against ``to_otlp_json(encode_spans(spans))`` (the file
exporter's former line, as test_otlp_json.py). Those modules' tests go through the C encoder first; here
it is called alone, so a batch it hands back (None) cannot hide behind the Python writers: each test says
which batches it must write itself.
"""
from __future__ import annotations

import sys
from typing import Any

import pytest

from hypothesis import HealthCheck, given, settings
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceState

from otel_ebpf.emit import otlp_native
from tests.unit.emit.test_otlp_json import (
    DIRECT_ONLY,
    old_line,
    direct_span,
    direct_spans,
    exactly_encodable,
    generated_spans,
    resources,
    traced_spans,
)
from tests.unit.emit.test_otlp_proto import sdk_bytes


FORMATS = ["proto", "json"]


def native(spans: list[Any], fmt: str = "proto") -> bytes | str | None:
    from otel_ebpf.emit import _otlpenc  # type: ignore[attr-defined]

    out: bytes | str | None = (_otlpenc.encode_spans if fmt == "proto" else _otlpenc.encode_spans_json)(spans)
    return out


def reference(spans: list[ReadableSpan], fmt: str) -> bytes | str:
    return sdk_bytes(spans) if fmt == "proto" else old_line(spans)


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
    assert otlp_native.NATIVE, "otel_ebpf.emit._otlpenc did not build (pip install -e . builds it; needs gcc)"


@pytest.mark.parametrize("fmt", FORMATS)
def test_sdk_made_spans_are_written_by_the_c_encoder_byte_for_byte(fmt: str):
    """Parents, the five kinds, statuses with messages, events, links, dropped counts, every value kind but dicts,
    non-ASCII and control characters, 4 resources (two equal: one group), scopes with versions and attributes."""
    spans = traced_spans()
    assert all(on_fast_path(s) for s in spans)
    assert native(spans, fmt) == reference(spans, fmt)
    for span in spans:
        assert native([span], fmt) == reference([span], fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_directly_built_spans_are_written_or_handed_back(fmt: str):
    spans = direct_spans()
    fast = [s for s in spans if on_fast_path(s)]
    assert len(fast) == len(spans) - 1  # the first has a trace state and dict values
    for span in spans:
        assert native([span], fmt) == (reference([span], fmt) if on_fast_path(span) else None)
    assert native(fast, fmt) == reference(fast, fmt)
    assert native(spans, fmt) is None  # one span off the fast path: the whole batch goes to Python


@pytest.mark.parametrize("fmt", FORMATS)
def test_values_only_direct_spans_carry_are_written_too(fmt: str):
    """None, bytes, lists, nested arrays, the empty key: what SpanBuilder's spans may hold and the SDK's tracer
    would rewrite."""
    values = {k: v for k, v in DIRECT_ONLY.items() if not _has_dict(v)}
    values |= {f"bytes.{n}": bytes(range(250, 250 - n, -1)) for n in range(1, 7)}  # every base64 padding
    remote = SpanContext(7, 8, is_remote=True)
    span = direct_span("values", values, resource=resources()[1], scope=InstrumentationScope("x", "1"),
                       parent=remote, events=(Event("e", values, 3),), links=(Link(remote, values),),
                       status=Status(StatusCode.ERROR, "é"))
    deep = direct_span("deep", {"a": ((((1,),),),)}, resource=resources()[0], scope=None)
    assert native([span, deep], fmt) == reference([span, deep], fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_of_many_resources_and_scopes_is_grouped_as_the_sdk_groups_it(fmt: str):
    res = resources()
    scopes = [None, InstrumentationScope("a"), InstrumentationScope("a"), InstrumentationScope("b", "2")]
    spans = [direct_span(f"s{i}", {"i": i}, resource=res[(i * 7) % 4], scope=scopes[(i * 3) % 4], span_id=i + 1)
             for i in range(200)]
    assert native(spans, fmt) == reference(spans, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_resource_is_encoded_once_and_its_bytes_kept_for_every_batch_after(fmt: str):
    """The first batch keeps each resource's encoding on the resource (a Resource never changes); later batches
    write those bytes, the same as the SDK's."""
    res = resources()
    spans = [direct_span(f"s{i}", {"i": i}, resource=res[i % 4], scope=None, span_id=i + 1) for i in range(8)]
    key = "_oe_otlp_pb" if fmt == "proto" else "_oe_otlp_json"
    for r in res:
        r.__dict__.pop(key, None)
    first = native(spans, fmt)
    kept = [r for r in res if type(r.__dict__.get(key)) is bytes]
    assert all(any(r == k for k in kept) for r in res) and len(kept) == len({id(r) for r in res}) - 1  # 2 equal
    assert native(spans, fmt) == first == reference(spans, fmt)
    res[0].__dict__[key] = b"kept"  # written as kept, not encoded again
    assert (b"kept" if fmt == "proto" else "kept") in native(spans[:1], fmt)


def _nested(depth: int) -> object:
    """``(((1,),),)`` ``depth`` tuples deep."""
    value: object = 1
    for _ in range(depth):
        value = (value,)
    return value


@pytest.mark.parametrize("fmt", FORMATS)
def test_it_hands_back_what_it_does_not_write(fmt: str):
    res = resources()[0]
    cases = [direct_span("state", {}, resource=res, scope=None, trace_state=TraceState([("k", "v")])),
             direct_span("dict", {"d": {"k": 1}}, resource=res, scope=None),
             direct_span("surrogate", {"s": "\ud800"}, resource=res, scope=None),
             direct_span("int65", {"i": 2**63}, resource=res, scope=None),
             direct_span("object", {"o": object()}, resource=res, scope=None),
             direct_span("negative start", {}, resource=res, scope=None, start=-1),
             direct_span("too deep", {"a": _nested(34)}, resource=res, scope=None)]
    for span in cases:
        assert native([span], fmt) is None, span.name


def test_it_holds_no_reference_it_took():
    spans = traced_spans()
    res, scope = spans[0].resource, spans[0].instrumentation_scope
    before = sys.getrefcount(res), sys.getrefcount(scope)
    for _ in range(50):
        for fmt in FORMATS:
            native(spans, fmt)
            native(direct_spans(), fmt)
    assert (sys.getrefcount(res), sys.getrefcount(scope)) == before


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generated_spans())
def test_generated_spans_are_written_as_the_sdk_encodes_them_or_handed_back(spans):
    for fmt in FORMATS:
        out = native(spans, fmt)
        if not exactly_encodable(spans):
            assert out is None
        elif all(on_fast_path(s) for s in spans):
            assert out == reference(spans, fmt)


class _Wrapped:
    """Not a ReadableSpan: only its public attributes (the C encoder reads a ReadableSpan's fields directly)."""

    def __init__(self, span: ReadableSpan) -> None:
        self._span = span

    def __getattr__(self, name: str) -> Any:
        return getattr(self._span, name)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_span_of_another_class_is_read_through_its_public_attributes(fmt: str):
    spans = traced_spans()
    assert native([_Wrapped(s) for s in spans], fmt) == reference(spans, fmt)  # type: ignore[misc]


# ---- spans encoded ahead (encode_each; otlp_proto.encode_ahead, a sending queue's put) ----

def _ahead(spans: list[Any]) -> list[Any]:
    from otel_ebpf.emit import _otlpenc  # type: ignore[attr-defined]

    out: list[Any] = _otlpenc.encode_each(spans)
    return out


def test_spans_encoded_ahead_make_the_sdks_request_bytes_alone_and_mixed_with_others():
    """Each span's (bytes, resource, scope), joined by encode_spans, is the SDK's request of the spans, grouped as
    they are (4 resources, two of them equal; scopes with and without versions), mixed in any proportion with spans
    not encoded ahead, and encoded ahead twice changes nothing."""
    spans = traced_spans()
    ahead = _ahead(spans)
    assert len(ahead) == len(spans) and all(type(a) is tuple and len(a) == 3 and type(a[0]) is bytes for a in ahead)
    assert native(ahead) == reference(spans, "proto")
    mixed = [a if i % 3 else s for i, (a, s) in enumerate(zip(ahead, spans, strict=True))]
    assert native(mixed) == reference(spans, "proto")
    assert _ahead(ahead) == ahead and native(_ahead(mixed)) == reference(spans, "proto")
    res = resources()
    scopes = [None, InstrumentationScope("a"), InstrumentationScope("a"), InstrumentationScope("b", "2")]
    many = [direct_span(f"s{i}", {"i": i}, resource=res[(i * 7) % 4], scope=scopes[(i * 3) % 4], span_id=i + 1)
            for i in range(200)]
    assert native(_ahead(many)) == reference(many, "proto")


def test_a_span_off_the_fast_path_is_left_as_it_is_and_its_batch_still_written_exactly():
    """encode_each leaves a span it cannot write (a trace state, a dict value) as it is; encode_spans then hands the
    batch back, and the Python encoder, given the spans encoded ahead too, writes the SDK's bytes."""
    from otel_ebpf.emit.otlp_proto import encode_ahead, spans_to_otlp_proto

    spans = direct_spans()
    ahead = encode_ahead(spans)
    assert [a is s for a, s in zip(ahead, spans, strict=True)] == [not on_fast_path(s) for s in spans]
    assert native(ahead) is None
    fast = [s for s in spans if on_fast_path(s)]
    assert spans_to_otlp_proto(ahead) == reference(spans, "proto") and native(_ahead(fast)) == reference(fast, "proto")


def test_spans_encoded_ahead_are_protobuf_only_and_span_items_are_encoded_ahead_too():
    from otel_ebpf.emit.spans import readable_spans
    from tests.unit.emit.test_span_items import items as span_items

    items = span_items()
    spans = readable_spans(items)
    ahead = _ahead(items)
    assert all(type(a) is tuple and len(a) == 3 for a in ahead)
    assert native(ahead) == reference(spans, "proto")
    assert native(ahead, "json") is None  # the JSON encoder never joins protobuf bodies
    assert sdk_bytes(readable_spans(ahead)) == reference(spans, "proto")  # the SDK's fallback reads them back


def test_encoding_ahead_holds_no_reference_it_took():
    spans = traced_spans()
    res, scope = spans[0].resource, spans[0].instrumentation_scope
    before = sys.getrefcount(res), sys.getrefcount(scope)
    for _ in range(50):
        native(_ahead(spans))
        _ahead(direct_spans())
    assert (sys.getrefcount(res), sys.getrefcount(scope)) == before
