"""otel_ebpf.core.readable.with_changes: the copy it writes field by field is the one the SDK's constructor makes."""
from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_ebpf.core.events import SpanEventRecord
from otel_ebpf.core.readable import _events, with_changes
from tests.unit.emit.test_otlp_json import direct_spans, traced_spans
from tests.unit.emit.test_otlpdec import opened


def constructed(span: ReadableSpan, attributes: dict[str, Any], start_ns: int | None, end_ns: int | None,
                events: tuple[SpanEventRecord, ...], ids: tuple[int, int] | None) -> ReadableSpan:
    """with_changes before it wrote the fields itself: through ReadableSpan's constructor."""
    from opentelemetry.trace import SpanContext, TraceFlags

    extra = _events(events) if events else None
    context, parent = span.context, span.parent
    if ids is not None and context is not None:
        context = SpanContext(context.trace_id, ids[0], is_remote=False, trace_flags=TraceFlags(1))
        parent = SpanContext(context.trace_id, ids[1], is_remote=True, trace_flags=TraceFlags(1))
    return ReadableSpan(
        span.name, context=context, parent=parent, resource=span.resource, attributes=attributes,
        events=(*span.events, *extra) if extra else span.events, links=span.links, kind=span.kind,
        status=span.status, start_time=span.start_time if start_ns is None else start_ns,
        end_time=span.end_time if end_ns is None else end_ns, instrumentation_scope=span.instrumentation_scope)


CHANGES = [({"a": 1}, None, None, (), None),
           ({"nccl.wait_ns": 5}, 10, 20, (SpanEventRecord("e", 15, {"k": "v"}),), None),
           ({}, None, 99, (), (0x1234, 0x5678))]


@pytest.mark.parametrize("change", CHANGES)
def test_a_copy_has_the_fields_the_constructor_gives(change):
    spans = [*traced_spans(), *direct_spans()]
    for span in spans:
        got = with_changes(span, dict(change[0]), start_ns=change[1], end_ns=change[2], events=change[3],
                           ids=change[4])
        ref = constructed(span, dict(change[0]), *change[1:])
        assert type(got) is ReadableSpan
        assert opened(got) == opened(ref)
        assert got.resource is span.resource and got.instrumentation_scope is span.instrumentation_scope
        try:
            want = ref.to_json()
        except TypeError:  # bytes values: the SDK's to_json cannot write them either way
            continue
        assert got.to_json() == want


def test_another_span_class_goes_through_the_constructor():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("live", attributes={"x": 1}) as live:
        copy = with_changes(live, {"y": 2})  # a recording span: an SDK _Span, not a ReadableSpan
    assert type(copy) is ReadableSpan and dict(copy.attributes) == {"y": 2} and copy.name == "live"
