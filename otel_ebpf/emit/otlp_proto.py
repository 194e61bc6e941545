"""Spans and log records -> OTLP protobuf request bytes, written directly (no protobuf messages).

:func:`spans_to_otlp_proto` returns exactly the bytes ``encode_spans(spans).SerializeToString()``
returns (the SDK's OTLP encoder, then protobuf's serializer), and :func:`logs_to_otlp_proto`
exactly those of ``encode_logs``: the request body the OTLP/gRPC and OTLP/HTTP exporters send,
for a fraction of the CPU (``bench/file_export.py``, docs/benchmarks.md). It is the wire twin
of :mod:`.otlp_json`, which it follows field for field; what that path writes, and so what this
module writes (opentelemetry-exporter-otlp-proto-common 1.45, opentelemetry-proto 1.45's
``trace.proto``/``logs.proto``/``common.proto``, protobuf 7.x serialization):

* fields in field-number order (``Span.flags``, number 16, comes last), each as its tag, then a
  varint, a fixed 8 or 4 bytes (``fixed64`` times, the ``double``, the ``fixed32`` flags), or a
  length and the bytes of a string, bytes field or message;
* grouped by resource, then by instrumentation scope, in the order each first appears, as the
  SDK's encoders group them; a resource is encoded once per batch;
* a scalar field at its default (0, ``""``, no bytes) is left out; a message field the encoder
  sets is written even when empty (status, resource, scope, body); an AnyValue holds its one
  member even at its default (a ``oneof``), and the AnyValue of None is empty;
* int64 (``intValue``) and a negative enum as the 10-byte varint of their two's complement.

A span received over OTLP (it carries its Span message as received: ``otlp_common.RECEIVED_SPAN``) is written
as those bytes, with the attributes added to its own dict since spliced in after the received ones (where
protobuf's serializer writes an added attribute); for a span the SDK encoded, that is what the SDK's path writes
of it, and what else the sender wrote (dropped counts, unknown fields) stays (``_received``).

Anything it cannot write exactly as that path would raises :class:`~.otlp_common.Unencodable`
(the same cases as :mod:`.otlp_json`), and the caller encodes the batch the SDK's way.

Spans go first through the C extension ``otel_ebpf.emit._otlpenc`` (``_otlpenc.c``: the same
rules, function for function, ~10x faster: docs/benchmarks.md), which hands a batch back (None)
when any span is off its fast path (a trace state, a dict value, a lone surrogate...); this module
then writes or refuses it. Without the extension (built optional: no C compiler) everything is
written here (otlp_native.NATIVE says which).
Thread-safe: the one shared state, a cache of encoded attribute keys bounded at 4,096 entries,
is only touched by single dict operations.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status

from . import otlp_native
from .otlp_common import I64 as _I64
from .otlp_common import U32 as _U32
from .otlp_common import U64 as _U64
from .spans import SpanItem, readable_spans
from .otlp_common import RECEIVED_SPAN, Unencodable, checked, enum_number, grouped, int64, span_id, trace_id, unsigned

__all__ = ["encode_ahead", "logs_to_otlp_proto", "python_spans_to_otlp_proto", "spans_to_otlp_proto"]

_DOUBLE = struct.Struct("<d").pack
_FIXED64 = struct.Struct("<Q").pack
_KINDS = {SpanKind.INTERNAL: b"\x30\x01", SpanKind.SERVER: b"\x30\x02", SpanKind.CLIENT: b"\x30\x03",
          SpanKind.PRODUCER: b"\x30\x04", SpanKind.CONSUMER: b"\x30\x05"}
# Span.flags (field 16, fixed32): SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, plus ..._IS_REMOTE_MASK
_LOCAL, _REMOTE = b"\x85\x01\x00\x01\x00\x00", b"\x85\x01\x00\x03\x00\x00"
_LINK_LOCAL, _LINK_REMOTE = b"\x35\x00\x01\x00\x00", b"\x35\x00\x03\x00\x00"  # Link.flags is field 6
_SMALL = [bytes([n]) for n in range(128)]
_T = TypeVar("_T", ReadableSpan, ReadableLogRecord)
_HEADS: dict[str, bytes] = {}  # attribute key -> its encoded KeyValue.key field (_key_head)
_HEADS_MAX = 4096




def _varint(value: int) -> bytes:
    """An unsigned varint; a negative int64 as its two's complement (10 bytes), as protobuf writes it.
    Unrolled up to 4 bytes (below 2**28: thread ids, pids, sizes, lengths), a loop above."""
    if value < 0x4000:
        if value >= 0x80:
            return bytes((value & 0x7F | 0x80, value >> 7))
        if value >= 0:
            return _SMALL[value]
    elif value < 0x10000000:
        if value < 0x200000:
            return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14 & 0x7F | 0x80, value >> 21))
    if value < 0:
        value += _U64
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field: its tag, the length of ``body``, ``body``."""
    n = len(body)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + body


def _utf8(text: Any) -> bytes:
    """A string field's bytes; its text must be valid for a protobuf string field (no lone surrogate)."""
    if type(text) is not str:
        raise Unencodable(f"not a str: {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise Unencodable("a string with a lone surrogate") from None


def _int64(value: int) -> bytes:
    return _varint(int64(value))


def _enum(value: Any) -> bytes:
    return _varint(enum_number(value))


def _value(value: Any) -> bytes:
    """The AnyValue message body of one attribute value (the SDK's ``_encode_value``)."""
    kind = type(value)
    if kind is str:
        return _field(b"\x0a", _utf8(value))
    if kind is int:
        return b"\x18" + _int64(value)
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is float:
        return b"\x21" + _DOUBLE(value)
    if value is None:
        return b""
    if kind is tuple or kind is list:
        return _field(b"\x2a", b"".join([_field(b"\x0a", _value(v)) for v in value]))
    if kind is bytes:
        return _field(b"\x3a", value)
    if kind is dict:
        pairs = [_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items()]
        return _field(b"\x32", b"".join(pairs))
    raise Unencodable(f"a value of type {kind.__name__}")


def _key_head(key: Any) -> bytes:
    """The KeyValue's ``key`` field (nothing for the empty key: its default), cached: keys repeat."""
    if type(key) is not str:
        raise Unencodable(f"a key of type {type(key).__name__}")
    head = _HEADS.get(key)
    if head is None:
        head = _field(b"\x0a", _utf8(key)) if key else b""
        if len(_HEADS) >= _HEADS_MAX:  # many distinct keys: start over rather than grow (dict ops are atomic)
            _HEADS.clear()
        _HEADS[key] = head
    return head


def _key_value(key: Any, value: Any) -> bytes:
    return _key_head(key) + _field(b"\x12", _value(value))


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """The repeated KeyValue field ``tag``, or b"" when there are none (the SDK's ``_encode_attributes``)."""
    if not attributes:
        return b""
    parts = []
    for key, value in attributes.items():  # _key_head and _value's commonest cases inlined: the hot loop
        head = _HEADS.get(key) if type(key) is str else None
        if head is None:
            head = _key_head(key)
        kind = type(value)
        if kind is int and 0 <= value < _I64:
            body = b"\x18" + (_SMALL[value] if value < 128 else _varint(value))
        elif kind is str and value.isascii():
            n = len(value)
            body = (b"\x0a" + _SMALL[n] if n < 128 else b"\x0a" + _varint(n)) + value.encode("ascii")
        elif kind is float:
            body = b"\x21" + _DOUBLE(value)
        else:
            body = _value(value)
        n = len(body)
        if n < 126 - len(head):  # the KeyValue's length fits one byte too
            parts.append(b"".join((tag, _SMALL[len(head) + 2 + n], head, b"\x12", _SMALL[n], body)))
        else:
            kv = head + b"\x12" + _varint(n) + body
            parts.append(tag + _varint(len(kv)) + kv)
    return b"".join(parts)


def _trace_id(value: Any) -> bytes:
    return trace_id(value).to_bytes(16, "big")


def _span_id(value: Any) -> bytes:
    return span_id(value).to_bytes(8, "big")


def _time(tag: bytes, value: Any) -> bytes:
    """A fixed64 time field, left out at 0."""
    return tag + _FIXED64(unsigned(value, _U64)) if value else b""


def _count(tag: bytes, value: Any) -> bytes:
    """A uint32 count field, left out at 0."""
    return tag + _varint(unsigned(value, _U32)) if value else b""


def _string(tag: bytes, value: Any) -> bytes:
    """A string field, left out when empty (or None)."""
    return _field(tag, _utf8(value)) if value else b""


def _event(event: Event) -> bytes:
    return (_time(b"\x09", event.timestamp) + _string(b"\x12", event.name)
            + _attributes(b"\x1a", event.attributes) + _count(b"\x20", event.dropped_attributes))


def _link(link: Link) -> bytes:
    context = link.context
    return (_field(b"\x0a", _trace_id(context.trace_id)) + _field(b"\x12", _span_id(context.span_id))
            + _attributes(b"\x22", link.attributes) + _count(b"\x28", link.dropped_attributes)
            + (_LINK_REMOTE if context.is_remote else _LINK_LOCAL))


def _status(status: Status) -> bytes:
    """The Status field (15), written even when empty."""
    code, message = status.status_code.value, status.description
    body = _string(b"\x12", message) + (b"\x18" + _enum(code) if code else b"")
    return _field(b"\x7a", body)


def _span_head(span: ReadableSpan, context: SpanContext, parent: SpanContext | None) -> list[bytes]:
    """A Span's fields 1-8 (ids, trace state, name, kind, times)."""
    fields = [b"\x0a\x10" + _trace_id(context.trace_id), b"\x12\x08" + _span_id(context.span_id)]
    trace_state = context.trace_state
    if trace_state:
        fields.append(_field(b"\x1a", _utf8(",".join([f"{k}={v}" for k, v in trace_state.items()]))))
    if parent:
        fields.append(b"\x22\x08" + _span_id(parent.span_id))
    name = span.name
    if name:
        fields.append(_field(b"\x2a", _utf8(name)))
    kind = _KINDS.get(span.kind)
    if kind is None:
        raise Unencodable(f"span kind {span.kind!r}")
    fields.append(kind)
    start, end = span.start_time, span.end_time
    if type(start) is int and type(end) is int and 0 < start < _U64 and 0 < end < _U64:
        fields.append(b"\x39" + _FIXED64(start) + b"\x41" + _FIXED64(end))
    else:
        fields.append(_time(b"\x39", start) + _time(b"\x41", end))
    return fields


def _field_ends(body: bytes) -> list[tuple[int, int]]:
    """(field number, end offset) of each top-level field of a message body; raises ValueError on bytes that end
    inside a field or a wire type protobuf 3 does not write (groups)."""
    out, i, n = [], 0, len(body)
    while i < n:
        tag, i = _read_varint(body, i)
        wire = tag & 7
        if wire == 0:
            _, i = _read_varint(body, i)
        elif wire == 2:
            size, i = _read_varint(body, i)
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
        if i > n:
            raise ValueError("a field past the end")
        out.append((tag >> 3, i))
    return out


def _read_varint(body: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(body) or shift > 63:
            raise ValueError("a varint past the end")
        byte = body[i]
        value |= (byte & 0x7F) << shift
        i += 1
        shift += 7
        if not byte & 0x80:
            return value, i


def _received(span: ReadableSpan) -> bytes | None:
    """A span received over OTLP (``_otlp_span``: its Span message as received, kept by otel_ebpf.emit.otlp_in)
    as those bytes, with each attribute added to its own dict since written right after the last received one
    (with none, before the first field above 9, else at the end: where protobuf's serializer writes it). None when
    the bytes cannot be the span's any more (fewer attributes than received, not a plain dict, bytes that do not
    parse): the span is then written from its fields. The C encoder's put_received, line for line."""
    own = span.__dict__
    raw, attrs = own.get(RECEIVED_SPAN), own.get("_attributes")
    if type(raw) is not bytes or type(attrs) is not dict:
        return None
    try:
        ends = _field_ends(raw)
    except ValueError:
        return None
    received = sum(1 for number, _ in ends if number == 9)
    if len(attrs) < received:
        return None
    after_last, first_above, start = None, len(raw), 0
    for number, end in ends:
        if number == 9:
            after_last = end
        elif number > 9 and first_above == len(raw):
            first_above = start
        start = end
    at = first_above if after_last is None else after_last
    extra = [_key_value(k, v) for i, (k, v) in enumerate(attrs.items()) if i >= received]
    if not extra:
        return raw
    return b"".join([raw[:at], *(_field(b"\x4a", kv) for kv in extra), raw[at:]])


def _span(span: ReadableSpan) -> bytes:
    """One Span message body (the SDK's ``_encode_span``); a span received over OTLP as :func:`_received`."""
    if isinstance(span, ReadableSpan) and (body := _received(span)) is not None:
        return body
    context, parent = span.get_span_context(), span.parent
    if context is None:
        raise Unencodable("a span without a context")
    fields = _span_head(span, context, parent)
    fields.append(_attributes(b"\x4a", span.attributes))
    dropped = span.dropped_attributes
    if dropped:
        fields.append(_count(b"\x50", dropped))
    events, links = span.events, span.links
    if events:
        fields.append(b"".join([_field(b"\x5a", _event(e)) for e in events]))
    dropped = span.dropped_events
    if dropped:
        fields.append(_count(b"\x60", dropped))
    if links:
        fields.append(b"".join([_field(b"\x6a", _link(lk)) for lk in links]))
    dropped = span.dropped_links
    if dropped:
        fields.append(_count(b"\x70", dropped))
    if span.status is not None:
        fields.append(_status(span.status))
    fields.append(_REMOTE if parent and parent.is_remote else _LOCAL)
    return b"".join(fields)


def _log(record: ReadableLogRecord) -> bytes:
    """One LogRecord message body (the SDK's ``_encode_log``)."""
    log = record.log_record
    severity = getattr(log.severity_number, "value", None)
    fields = [_time(b"\x09", log.timestamp), b"\x10" + _enum(severity) if severity else b"",
              _string(b"\x1a", log.severity_text), _field(b"\x2a", _value(log.body)),
              _attributes(b"\x32", log.attributes), _count(b"\x38", record.dropped_attributes)]
    flags = unsigned(int(log.trace_flags), _U32)  # a None trace_flags fails, as in the SDK
    if flags:
        fields.append(b"\x45" + flags.to_bytes(4, "little"))
    if log.trace_id != 0:  # as the SDK: 0 is no id, None fails
        fields.append(b"\x4a\x10" + _trace_id(log.trace_id))
    if log.span_id != 0:
        fields.append(b"\x52\x08" + _span_id(log.span_id))
    fields.append(_time(b"\x59", log.observed_timestamp))
    fields.append(_string(b"\x62", log.event_name))
    return b"".join(fields)


def _scope(scope: InstrumentationScope | None) -> bytes:
    """The ``scope`` field (1) of a ScopeSpans/ScopeLogs (the SDK's ``_encode_instrumentation_scope``)."""
    if scope is None:
        return b"\x0a\x00"
    return _field(b"\x0a", _string(b"\x0a", scope.name) + _string(b"\x12", scope.version)
                  + _attributes(b"\x1a", scope.attributes))


def _encode(items: Sequence[_T], encode: Callable[[_T], bytes]) -> bytes:
    """Write the request of ``items``, grouped as the SDK's encoders group them (otlp_common.grouped);
    the field numbers of the three levels are the same for spans and logs: resource 1, scopes 2,
    schema URL 3; items 2."""
    def item(one: _T) -> bytes:
        body = encode(one)
        n = len(body)
        return b"\x12" + (_SMALL[n] if n < 128 else _varint(n)) + body

    blocks = []
    for resource, scopes in grouped(items, item).items():
        scope_blocks = []
        for scope, encoded in scopes.items():
            schema = _string(b"\x1a", scope.schema_url) if scope is not None else b""
            scope_blocks.append(_field(b"\x12", _scope(scope) + b"".join(encoded) + schema))
        head = _field(b"\x0a", _attributes(b"\x0a", resource.attributes))
        blocks.append(_field(b"\x0a", head + b"".join(scope_blocks) + _string(b"\x1a", resource.schema_url)))
    return b"".join(blocks)


def spans_to_otlp_proto(spans: Sequence[ReadableSpan | SpanItem]) -> bytes:
    """The serialized ExportTraceServiceRequest of ``spans``; raises :class:`~.otlp_common.Unencodable`
    when it cannot be written exactly as ``encode_spans(spans).SerializeToString()``."""
    if otlp_native.SPANS_PROTO is not None:
        out = otlp_native.SPANS_PROTO(spans)
        if out is not None:
            return out
    return python_spans_to_otlp_proto(readable_spans(spans))  # span items: as their SDK spans


def encode_ahead(spans: Sequence[ReadableSpan | SpanItem]) -> list[Any]:
    """``spans`` each encoded now for :func:`spans_to_otlp_proto` (in C: ``_otlpenc.encode_each``): a (Span message
    bytes, resource, scope) tuple, which it joins as they are, grouped as the span would be; a span off the C
    encoder's fast path as it is. The same request bytes for any batch of them, encoded ahead or not. A sending queue
    of an OTLP exporter calls it as it takes spans (Emitter's ``encode_ahead``): the spans are read while still in
    the CPU's caches and may be freed there. Without the extension, the spans as they are."""
    each = otlp_native.SPANS_EACH
    return each(spans) if each is not None else list(spans)


def python_spans_to_otlp_proto(spans: Sequence[ReadableSpan]) -> bytes:
    """:func:`spans_to_otlp_proto` without the C extension (the reference its tests compare it with)."""
    return checked(lambda: _encode(spans, _span))


def logs_to_otlp_proto(records: Sequence[ReadableLogRecord]) -> bytes:
    """The serialized ExportLogsServiceRequest of ``records``; raises :class:`~.otlp_common.Unencodable`
    when it cannot be written exactly as ``encode_logs(records).SerializeToString()``."""
    return checked(lambda: _encode(records, _log))
