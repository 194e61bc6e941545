"""SpanRecord -> what the exporters get: a span item (:data:`SpanItem`), or the SDK's ``ReadableSpan``.

The emitter queues span items: the record with its resource, scope and ids, nothing more (issue 19: building
the SDK span cost ~1 us a span on the pipeline thread against ~0.25 for the item, and a queued CUDA span with its
record held 1,240 bytes against 728). The file and OTLP
exporters hand them to the C encoders, which write each item exactly as the SDK writes the ReadableSpan
:func:`readable` makes of it (otel_ebpf/emit/_otlpenc_records.c; tests/unit/emit/test_span_items.py compares
the bytes); everything else (another SDK exporter, a batch the C path hands back) gets that span
(:func:`readable_spans`).

The span is the SDK's own class with the instance fields ``ReadableSpan.__init__`` sets
(opentelemetry-sdk 1.45, ``sdk/trace/__init__.py``), written in one dict instead of fifteen stores, and its
``SpanContext`` made as ``SpanContext.__new__`` makes it (opentelemetry-api 1.45, ``trace/span.py``: a tuple of
trace id, span id, is_remote, flags, trace state, validity) without its Python-level call. Every reader (the SDK's
encoders, ``to_json``, the in-memory exporter, our C encoder) sees the same span as the constructors would give:
tests/unit/emit/test_spans.py compares the instances' fields and their encoded bytes.

Every span is sampled; a record without ids gets random ones when its item is made (the SDK's
``RandomIdGenerator``: 128 and 64 random bits, never 0), so every exporter writes the same ids; a record with ids
keeps them exactly (derived ids the collective join relies on). :class:`SpanBuilder` is not thread-safe (one scope
cache): the :class:`~otel_ebpf.emit.emitter.Emitter` calls it under its lock; :func:`readable` is.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE
from opentelemetry.trace.status import Status, StatusCode

from otel_ebpf.core.events import SpanRecord

__all__ = ["SpanBuilder", "SpanItem", "readable", "readable_spans"]

#: What the emitter queues for a span: (record, its process's resource, its scope, trace id, span id), the ids
#: drawn once so that every exporter writes the same span. The C encoders write it as the ReadableSpan
#: :func:`readable` makes of it (otel_ebpf/emit/_otlpenc_records.c), without making it; anything else gets that
#: span (:func:`readable_spans`).
SpanItem = tuple[SpanRecord, Resource, InstrumentationScope, int, int]

_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER,
          "producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_OK = Status(StatusCode.UNSET)
_TRACE_MAX, _SPAN_MAX = (1 << 128) - 1, (1 << 64) - 1  # the API's _TRACE_ID_MAX_VALUE, _SPAN_ID_MAX_VALUE
_new_span = ReadableSpan.__new__
_new_tuple = tuple.__new__
_bits = random.getrandbits  # what RandomIdGenerator draws from


def _context(trace_id: int, span_id: int, is_remote: bool) -> SpanContext:
    """``SpanContext(trace_id, span_id, is_remote, trace_flags=SAMPLED)``: the same tuple its ``__new__`` returns."""
    valid = 0 < trace_id <= _TRACE_MAX and 0 < span_id <= _SPAN_MAX
    return _new_tuple(SpanContext, (trace_id, span_id, is_remote, _SAMPLED, DEFAULT_TRACE_STATE, valid))


def _id(bits: int) -> int:
    """A random non-zero id of ``bits`` bits, as RandomIdGenerator draws it (0 is drawn again)."""
    v = _bits(bits)
    while not v:
        v = _bits(bits)
    return v


class SpanBuilder:
    """Builds finished spans; one ``InstrumentationScope`` object per scope name."""

    def __init__(self) -> None:
        self._scopes: dict[str, InstrumentationScope] = {}

    def build(self, rec: SpanRecord, resource: Resource) -> ReadableSpan:
        """The span of ``rec`` on ``resource``; raises KeyError for an unknown kind."""
        return readable(self.item(rec, resource))

    def item(self, rec: SpanRecord, resource: Resource) -> SpanItem:
        """The :data:`SpanItem` of ``rec`` on ``resource``, its missing ids drawn now; raises KeyError for an
        unknown kind."""
        _KINDS[rec.kind]
        scope = self._scopes.get(rec.scope)
        if scope is None:
            scope = self._scopes[rec.scope] = InstrumentationScope(rec.scope)
        # _id's draws, its call saved when the first is not 0 (nearly always): the same ids from the same generator
        return (rec, resource, scope, rec.trace_id or _bits(128) or _id(128), rec.span_id or _bits(64) or _id(64))


def readable(item: SpanItem) -> ReadableSpan:
    """The SDK span of a span item. Thread-safe."""
    rec, resource, scope, trace_id, span_id = item
    parent = rec.parent_span_id
    span = _new_span(ReadableSpan)
    fields: dict[str, Any] = {  # ReadableSpan.__init__'s fields, in its order
        "_name": rec.name,
        "_context": _context(trace_id, span_id, False),
        "_kind": _KINDS[rec.kind],
        "_instrumentation_info": None,
        "_instrumentation_scope": scope,
        "_parent": _context(trace_id, parent, True) if parent is not None else None,
        "_start_time": rec.start_ns,
        "_end_time": max(rec.end_ns, rec.start_ns),
        "_attributes": rec.attributes,
        "_events": [Event(e.name, e.attributes, e.time_ns) for e in rec.events] if rec.events else [],
        "_links": [Link(_context(lk.trace_id, lk.span_id, True), lk.attributes) for lk in rec.links]
        if rec.links else [],
        "_resource": resource,
        "_status": _OK if rec.error is None else Status(StatusCode.ERROR, rec.error),
    }
    span.__dict__ = fields
    return span


def readable_spans(batch: Sequence[SpanItem | ReadableSpan]) -> list[ReadableSpan]:
    """``batch`` with each span item made its SDK span (:func:`readable`), each span encoded ahead
    (otlp_proto.encode_ahead) the span its bytes hold (otlp_in.encoded_span); SDK spans as they are."""
    return [(readable(x) if len(x) == 5 else _encoded(x)) if isinstance(x, tuple) else x for x in batch]


def _encoded(item: tuple[Any, ...]) -> ReadableSpan:
    from otel_ebpf.emit.otlp_in import encoded_span  # only a batch off the C encoder's fast path gets here

    return encoded_span(item)
