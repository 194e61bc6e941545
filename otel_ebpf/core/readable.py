"""Finished SDK spans (``ReadableSpan``) and received log records (``ReadableLogRecord``) for stages that
work on what arrived over OTLP.

The gateway's processors (``collective_join``) receive spans other agents already finished,
as SDK ``ReadableSpan`` objects (see :mod:`otel_ebpf.emit.otlp_in`). They read them through
the ``ReadableSpan`` API and build changed copies or new spans only through this module, so
the OTel SDK is still imported only under ``otel_ebpf.emit``.

Every span built here is sampled (an exported span was sampled) and owns its attribute dict:
callers hand over the mapping and must not change it afterwards. Pure functions, thread-safe.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from otel_ebpf.core.events import SpanEventRecord

__all__ = ["ReadableLogRecord", "ReadableSpan", "SpanMaker", "log_fields", "resource_attribute", "span_attributes",
           "span_times", "with_changes"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_new_span = ReadableSpan.__new__


def _events(records: Iterable[SpanEventRecord]) -> list[Event]:
    return [Event(r.name, dict(r.attributes), r.time_ns) for r in records]


def with_changes(span: ReadableSpan, attributes: dict[str, Any], *, start_ns: int | None = None,
                 end_ns: int | None = None, events: Sequence[SpanEventRecord] = (),
                 ids: tuple[int, int] | None = None) -> ReadableSpan:
    """A copy of ``span`` with ``attributes`` (all of them: the caller merged), optionally new
    times, extra events appended and, with ``ids`` = (span id, parent span id), a new span id
    under a new parent in the same trace (a span whose place the gateway learned later). Trace
    id, kind, status, links, resource and scope are kept. ``attributes`` becomes the copy's own dict.

    The copy of an SDK ``ReadableSpan`` is written field by field, as ``ReadableSpan(span.name, context=...,
    events=span.events, ...)`` would make it (its ``events``/``links`` properties give tuples, its
    ``instrumentation_info`` is not passed on): tests/unit/core/test_readable.py compares the two. Another class
    (an SDK ``_Span``) goes through the constructor."""
    extra = _events(events) if events else None
    context, parent = span.context, span.parent
    if ids is not None and context is not None:
        context = SpanContext(context.trace_id, ids[0], is_remote=False, trace_flags=_SAMPLED)
        parent = SpanContext(context.trace_id, ids[1], is_remote=True, trace_flags=_SAMPLED)
    start = span.start_time if start_ns is None else start_ns
    end = span.end_time if end_ns is None else end_ns
    if type(span) is ReadableSpan and span._resource is not None:
        own = span.__dict__
        copy = _new_span(ReadableSpan)
        copy.__dict__ = {
            "_name": own["_name"], "_context": context, "_kind": own["_kind"], "_instrumentation_info": None,
            "_instrumentation_scope": own["_instrumentation_scope"], "_parent": parent, "_start_time": start,
            "_end_time": end, "_attributes": attributes,
            "_events": (*own["_events"], *extra) if extra else tuple(own["_events"]),
            "_links": tuple(own["_links"]), "_resource": own["_resource"], "_status": own["_status"]}
        return copy
    return ReadableSpan(
        span.name, context=context, parent=parent, resource=span.resource,
        attributes=attributes, events=(*span.events, *extra) if extra else span.events,
        links=span.links, kind=span.kind, status=span.status, start_time=start, end_time=end,
        instrumentation_scope=span.instrumentation_scope)


_NONE: Mapping[str, Any] = MappingProxyType({})


def span_attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes, to read only. An SDK ``ReadableSpan``'s own mapping: its ``attributes`` property makes
    a new ``MappingProxyType`` on each read, and ``dict()`` of that proxy takes the slow mapping path (together ~30 %
    of the collective join's CPU at 1,024 ranks, bench/gateway.py under py-spy)."""
    if type(span) is ReadableSpan:
        return span._attributes or _NONE
    return span.attributes or _NONE


def span_times(span: ReadableSpan) -> tuple[int, int]:
    """(start, end) epoch ns of a finished span, 0 for one unset (always set on one received over OTLP); an SDK
    ``ReadableSpan``'s own fields, not its properties."""
    if type(span) is ReadableSpan:
        return span._start_time or 0, span._end_time or 0
    return span.start_time or 0, span.end_time or 0


def resource_attribute(span: ReadableSpan, key: str) -> Any:
    """One attribute of the span's resource, or None."""
    return span.resource.attributes.get(key)


class SpanMaker:
    """Builds new spans on one resource and instrumentation scope (both made once)."""

    def __init__(self, resource_attributes: Mapping[str, Any], scope: str, version: str | None = None) -> None:
        self.resource = Resource.create(dict(resource_attributes))
        self.scope = InstrumentationScope(scope, version)

    def make(self, name: str, *, trace_id: int, span_id: int, parent_span_id: int | None, start_ns: int,
             end_ns: int, attributes: dict[str, Any], events: Iterable[SpanEventRecord] = ()) -> ReadableSpan:
        """A finished INTERNAL span with these ids and times; ``attributes`` is taken over."""
        parent = (SpanContext(trace_id, parent_span_id, is_remote=True, trace_flags=_SAMPLED)
                  if parent_span_id is not None else None)
        return ReadableSpan(
            name, context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=_SAMPLED),
            parent=parent, resource=self.resource, attributes=attributes, events=_events(events),
            kind=SpanKind.INTERNAL, start_time=start_ns, end_time=max(start_ns, end_ns),
            instrumentation_scope=self.scope)


def log_fields(rec: ReadableLogRecord) -> tuple[str | None, Mapping[str, Any], Any, Mapping[str, Any]]:
    """(event name, attributes, body, resource attributes) of a received log record."""
    lr = rec.log_record
    resource = rec.resource.attributes if rec.resource is not None else {}
    return lr.event_name, lr.attributes or {}, lr.body, resource
