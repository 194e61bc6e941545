"""Spans and log records -> one OTLP/JSON line, written directly (no protobuf messages).

:func:`spans_to_otlp_json` returns exactly the string ``to_otlp_json(encode_spans(spans))``
returns (the SDK's OTLP protobuf encoder, then protobuf's pure-Python ``json_format``, ids
spelled in hex), and :func:`logs_to_otlp_json` exactly that of ``encode_logs``: the same bytes,
for ~1/13 of the CPU per span, ~1/8 per log record (``bench/file_export.py``, docs/benchmarks.md).
What that path writes, and so what this module writes (opentelemetry-exporter-otlp-proto-common
1.45, protobuf 7.x ``json_format`` with ``use_integers_for_enums``, ``json.dumps`` with
``separators=(",", ":")``):

* keys lowerCamelCase, in field-number order (``Span.flags``, number 16, comes last);
* grouped by resource, then by instrumentation scope, in the order each first appears, as the
  SDK's encoders group them (a dict keyed by the SDK objects); a resource is encoded once;
* a scalar field at its default (0, ``""``, no bytes, None) is left out; a message field the
  encoder sets is written even when empty (``"status":{}``, ``"resource":{}``, ``"scope":{}``,
  ``"body":{}``); an AnyValue holds its one member even at its default (``{"intValue":"0"}``),
  and the AnyValue of None is ``{}``;
* int64 and fixed64 (times, ``intValue``) as decimal strings; uint32, fixed32 (counts, flags)
  and enums (kind, status code, severity) as numbers; doubles as ``repr`` writes them, NaN and
  the infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; bytes in base64;
  trace and span ids as lowercase hex (OTLP/JSON); strings as ``json.dumps`` writes them (ASCII,
  ``\\uXXXX`` escapes).

Anything it cannot write exactly as that path would raises :class:`Unencodable` and nothing is
returned: a value of another type than None, bool, int, float, str, bytes, list, tuple or dict
(subclasses included), an int outside int64, a time outside fixed64, a count outside uint32, a
string holding a lone surrogate (protobuf refuses it). The caller then encodes the batch the
SDK's way, which drops such an attribute with a log line, or raises, as it always did. Any
other error the input causes (a span without a context, say) is raised as :class:`Unencodable`
too: a signal for the caller, a ``ValueError``, not one of the agent's errors (otel_ebpf.core.errors).
Thread-safe: the one shared state, a cache of escaped attribute keys bounded at 4,096 entries,
is only touched by single dict operations.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status

from . import otlp_native
from .otlp_common import I64 as _I64
from .otlp_common import U32 as _U32
from .otlp_common import U64 as _U64
from .otlp_common import U128 as _U128
from .spans import SpanItem, readable_spans
from .otlp_common import Unencodable, checked, enum_number, grouped, int64, span_id, trace_id, unsigned

__all__ = ["Unencodable", "logs_to_otlp_json", "python_spans_to_otlp_json", "spans_to_otlp_json"]

_ESCAPE: Callable[[str], str] = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str
# the SDK's SpanKind -> the proto's Span.SpanKind number (SPAN_KIND_INTERNAL = 1, ...)
_KINDS = {SpanKind.INTERNAL: '"kind":1', SpanKind.SERVER: '"kind":2', SpanKind.CLIENT: '"kind":3',
          SpanKind.PRODUCER: '"kind":4', SpanKind.CONSUMER: '"kind":5'}
# Span.flags: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, plus SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK for a remote parent
_LOCAL, _REMOTE = '"flags":256', '"flags":768'
_INF = float("inf")
_DOUBLES = {_INF: '"Infinity"', -_INF: '"-Infinity"'}
_T = TypeVar("_T", ReadableSpan, ReadableLogRecord)
_HEADS: dict[str, str] = {}  # attribute key -> its escaped head (_key_head)
_HEADS_MAX = 4096


def _str(text: Any) -> str:
    """A JSON string; its text must be valid for a protobuf string field (no lone surrogate)."""
    if type(text) is not str:
        raise Unencodable(f"not a str: {type(text).__name__}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise Unencodable("a string with a lone surrogate") from None
    return _ESCAPE(text)


def _int64(value: int) -> str:
    return str(int64(value))


def _unsigned(value: Any, limit: int) -> str:
    return str(unsigned(value, limit))


def _enum(value: Any) -> str:
    return str(enum_number(value))


def _double(value: float) -> str:
    if value != value:
        return '"NaN"'
    return _DOUBLES.get(value) or float.__repr__(value)


def _value(value: Any) -> str:
    """The AnyValue object of one attribute value (the SDK's ``_encode_value``)."""
    kind = type(value)
    if kind is str:
        return '{"stringValue":' + _str(value) + "}"
    if kind is int:
        return '{"intValue":"' + _int64(value) + '"}'
    if kind is bool:
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if kind is float:
        return '{"doubleValue":' + _double(value) + "}"
    if value is None:
        return "{}"
    if kind is tuple or kind is list:
        if not value:
            return '{"arrayValue":{}}'
        return '{"arrayValue":{"values":[' + ",".join([_value(v) for v in value]) + "]}}"
    if kind is bytes:
        return '{"bytesValue":"' + base64.b64encode(value).decode("ascii") + '"}'
    if kind is dict:
        if not value:
            return '{"kvlistValue":{}}'
        pairs = [_key_value(str(k), v) for k, v in value.items()]
        return '{"kvlistValue":{"values":[' + ",".join(pairs) + "]}}"
    raise Unencodable(f"a value of type {kind.__name__}")


def _key_head(key: Any) -> str:
    """``{"key":"<key>","value":`` (``{"value":`` for the empty key: its default), cached: keys repeat."""
    if type(key) is not str:
        raise Unencodable(f"a key of type {type(key).__name__}")
    head = _HEADS.get(key)
    if head is None:
        head = '{"key":' + _str(key) + ',"value":' if key else '{"value":'
        if len(_HEADS) >= _HEADS_MAX:  # many distinct keys: start over rather than grow (dict ops are atomic)
            _HEADS.clear()
        _HEADS[key] = head
    return head


def _key_value(key: Any, value: Any) -> str:
    return _key_head(key) + _value(value) + "}"


def _attributes(attributes: Mapping[str, Any] | None) -> str:
    """The ``"attributes":[...]`` field, or "" when there are none (the SDK's ``_encode_attributes``)."""
    if not attributes:
        return ""
    parts = []
    for key, value in attributes.items():  # _key_head and _value's commonest cases inlined: the hot loop
        head = _HEADS.get(key) if type(key) is str else None
        if head is None:
            head = _key_head(key)
        kind = type(value)
        if kind is str and value.isascii():
            parts.append(f'{head}{{"stringValue":{_ESCAPE(value)}}}}}')
        elif kind is int and -_I64 <= value < _I64:
            parts.append(f'{head}{{"intValue":"{value}"}}}}')
        elif kind is float and -_INF < value < _INF:  # not NaN nor an infinity
            parts.append(f'{head}{{"doubleValue":{float.__repr__(value)}}}}}')
        elif kind is bool:
            parts.append(head + ('{"boolValue":true}}' if value else '{"boolValue":false}}'))
        else:
            parts.append(f"{head}{_value(value)}}}")
    return '"attributes":[' + ",".join(parts) + "]"


def _trace_id(value: Any) -> str:
    return f"{trace_id(value):032x}"


def _span_id(value: Any) -> str:
    return f"{span_id(value):016x}"


def _optional(fields: list[str], name: str, value: Any, encode: Callable[[Any], str]) -> None:
    """Append ``"name":encode(value)`` unless value is at its default (None, 0, "", empty)."""
    if value:
        fields.append(name + encode(value))


def _add(fields: list[str], field: str) -> None:
    if field:
        fields.append(field)


def _time(value: Any) -> str:
    return '"' + _unsigned(value, _U64) + '"'


def _count(value: Any) -> str:
    return _unsigned(value, _U32)


def _event(event: Event) -> str:
    fields: list[str] = []
    _optional(fields, '"timeUnixNano":', event.timestamp, _time)
    _optional(fields, '"name":', event.name, _str)
    _add(fields, _attributes(event.attributes))
    _optional(fields, '"droppedAttributesCount":', event.dropped_attributes, _count)
    return "{" + ",".join(fields) + "}"


def _link(link: Link) -> str:
    context = link.context
    fields = ['"traceId":"' + _trace_id(context.trace_id) + '","spanId":"' + _span_id(context.span_id) + '"']
    _add(fields, _attributes(link.attributes))
    _optional(fields, '"droppedAttributesCount":', link.dropped_attributes, _count)
    fields.append(_REMOTE if context.is_remote else _LOCAL)
    return "{" + ",".join(fields) + "}"


def _status(status: Status) -> str:
    code, message = status.status_code.value, status.description
    if not code and not message:
        return '"status":{}'
    fields: list[str] = []
    _optional(fields, '"message":', message, _str)
    _optional(fields, '"code":', code, _enum)
    return '"status":{' + ",".join(fields) + "}"


def _span_head(span: ReadableSpan, context: SpanContext, parent: SpanContext | None) -> list[str]:
    """A Span's fields 1-8 (ids, trace state, name, kind, times); the first opens the object."""
    trace_id, span_id = context.trace_id, context.span_id
    if type(trace_id) is int and type(span_id) is int and 0 <= trace_id < _U128 and 0 <= span_id < _U64:
        fields = [f'{{"traceId":"{trace_id:032x}","spanId":"{span_id:016x}"']
    else:
        fields = [f'{{"traceId":"{_trace_id(trace_id)}","spanId":"{_span_id(span_id)}"']
    trace_state = context.trace_state
    if trace_state:
        fields.append('"traceState":' + _str(",".join([f"{k}={v}" for k, v in trace_state.items()])))
    if parent:
        fields.append(f'"parentSpanId":"{_span_id(parent.span_id)}"')
    name = span.name
    if name:
        fields.append('"name":' + _str(name))
    kind = _KINDS.get(span.kind)
    if kind is None:
        raise Unencodable(f"span kind {span.kind!r}")
    fields.append(kind)
    start, end = span.start_time, span.end_time
    if type(start) is int and type(end) is int and 0 < start < _U64 and 0 < end < _U64:
        fields.append(f'"startTimeUnixNano":"{start}","endTimeUnixNano":"{end}"')
    else:
        _optional(fields, '"startTimeUnixNano":', start, _time)
        _optional(fields, '"endTimeUnixNano":', end, _time)
    return fields


def _span(span: ReadableSpan) -> str:
    """One Span object (the SDK's ``_encode_span``); the hot path: optional fields tested in place."""
    context, parent = span.get_span_context(), span.parent
    if context is None:
        raise Unencodable("a span without a context")
    fields = _span_head(span, context, parent)
    attributes = _attributes(span.attributes)
    if attributes:
        fields.append(attributes)
    dropped = span.dropped_attributes
    if dropped:
        fields.append('"droppedAttributesCount":' + _count(dropped))
    events, links = span.events, span.links
    if events:
        fields.append('"events":[' + ",".join([_event(e) for e in events]) + "]")
    dropped = span.dropped_events
    if dropped:
        fields.append('"droppedEventsCount":' + _count(dropped))
    if links:
        fields.append('"links":[' + ",".join([_link(lk) for lk in links]) + "]")
    dropped = span.dropped_links
    if dropped:
        fields.append('"droppedLinksCount":' + _count(dropped))
    if span.status is not None:
        fields.append(_status(span.status))
    fields.append(_REMOTE if parent and parent.is_remote else _LOCAL)
    return ",".join(fields) + "}"


def _log(record: ReadableLogRecord) -> str:
    """One LogRecord object (the SDK's ``_encode_log``)."""
    log = record.log_record
    fields: list[str] = []
    _optional(fields, '"timeUnixNano":', log.timestamp, _time)
    severity = getattr(log.severity_number, "value", None)
    _optional(fields, '"severityNumber":', severity, _enum)
    _optional(fields, '"severityText":', log.severity_text, _str)
    fields.append('"body":' + _value(log.body))
    _add(fields, _attributes(log.attributes))
    _optional(fields, '"droppedAttributesCount":', record.dropped_attributes, _count)
    _optional(fields, '"flags":', int(log.trace_flags), _count)  # a None trace_flags fails, as in the SDK
    if log.trace_id != 0:  # as the SDK: 0 is no id, None fails
        fields.append('"traceId":"' + _trace_id(log.trace_id) + '"')
    if log.span_id != 0:
        fields.append('"spanId":"' + _span_id(log.span_id) + '"')
    _optional(fields, '"observedTimeUnixNano":', log.observed_timestamp, _time)
    _optional(fields, '"eventName":', log.event_name, _str)
    return "{" + ",".join(fields) + "}"


def _scope(scope: InstrumentationScope | None) -> str:
    """The ``"scope":{...}`` field (the SDK's ``_encode_instrumentation_scope``)."""
    fields: list[str] = []
    if scope is not None:
        _optional(fields, '"name":', scope.name, _str)
        _optional(fields, '"version":', scope.version, _str)
        _add(fields, _attributes(scope.attributes))
    return '"scope":{' + ",".join(fields) + "}"


def _resource(resource: Resource) -> str:
    return '"resource":{' + _attributes(resource.attributes) + "}"


def _encode(items: Sequence[_T], encode: Callable[[_T], str], top: str, middle: str, inner: str) -> str:
    """Write the request of ``items``, grouped as the SDK's encoders group them (otlp_common.grouped)."""
    groups = grouped(items, encode)
    if not groups:
        return "{}"
    blocks = []
    for resource, scopes in groups.items():
        scope_blocks = []
        for scope, encoded in scopes.items():
            schema = ',"schemaUrl":' + _str(scope.schema_url) if scope is not None and scope.schema_url else ""
            scope_blocks.append("{" + _scope(scope) + ',"' + inner + '":[' + ",".join(encoded) + "]" + schema + "}")
        schema = ',"schemaUrl":' + _str(resource.schema_url) if resource.schema_url else ""
        blocks.append("{" + _resource(resource) + ',"' + middle + '":[' + ",".join(scope_blocks) + "]" + schema + "}")
    return '{"' + top + '":[' + ",".join(blocks) + "]}"


def spans_to_otlp_json(spans: Sequence[ReadableSpan | SpanItem]) -> str:
    """The ExportTraceServiceRequest of ``spans`` as one OTLP/JSON line (no newline); raises
    :class:`Unencodable` when it cannot be written exactly as ``to_otlp_json(encode_spans(spans))``.
    The C encoder (otlp_native) writes it first; a batch it hands back is written here."""
    if otlp_native.SPANS_JSON is not None:
        out = otlp_native.SPANS_JSON(spans)
        if out is not None:
            return out
    return python_spans_to_otlp_json(readable_spans(spans))  # span items: as their SDK spans


def python_spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> str:
    """:func:`spans_to_otlp_json` without the C encoder (the reference its tests compare it with)."""
    return checked(lambda: _encode(spans, _span, "resourceSpans", "scopeSpans", "spans"))


def logs_to_otlp_json(records: Sequence[ReadableLogRecord]) -> str:
    """The ExportLogsServiceRequest of ``records`` as one OTLP/JSON line (no newline); raises
    :class:`Unencodable` when it cannot be written exactly as ``to_otlp_json(encode_logs(records))``."""
    return checked(lambda: _encode(records, _log, "resourceLogs", "scopeLogs", "logRecords"))
