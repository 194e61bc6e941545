"""What the direct OTLP encoders (:mod:`.otlp_json`, :mod:`.otlp_proto`) share: the refusal, the
range checks that decide what the SDK's path can encode, and the grouping of items by resource
then scope. Each encoder keeps only how it writes a value."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = ["I32", "I64", "RECEIVED_SPAN", "U32", "U64", "U128", "Groups", "Unencodable", "checked", "enum_number",
           "grouped", "int64", "span_id", "trace_id", "unsigned"]

I64 = 1 << 63
U64 = 1 << 64
U32 = 1 << 32
U128 = 1 << 128
I32 = 1 << 31
T = TypeVar("T", ReadableSpan, ReadableLogRecord)
E = TypeVar("E")
Groups = dict[Resource, dict[InstrumentationScope | None, list[E]]]

# The instance field of a ReadableSpan received over OTLP (otlp_in, _otlpdec.c) that holds its Span message as
# received; the protobuf encoders (otlp_proto, _otlpenc_spans.c) send those bytes on, with the attributes added to
# the span's own dict since. Such a span may only gain attributes in place (the collective join's nccl.wait_ns);
# any other change makes a new span (core.readable.with_changes), which does not carry the field.
RECEIVED_SPAN = "_otlp_span"


class Unencodable(ValueError):
    """A value the direct encoders cannot write exactly as the SDK's encoder path would."""


def int64(value: int) -> int:
    if -I64 <= value < I64:
        return value
    raise Unencodable(f"int outside int64: {value}")


def unsigned(value: Any, limit: int) -> int:
    if type(value) is int and 0 <= value < limit:
        return value
    raise Unencodable(f"not an unsigned int below {limit}: {value!r}")


def enum_number(value: Any) -> int:
    if type(value) is int and -I32 <= value < I32:
        return value
    raise Unencodable(f"not an enum number: {value!r}")


def trace_id(value: Any) -> int:
    if type(value) is int and 0 <= value < U128:
        return value
    raise Unencodable(f"trace id out of range: {value!r}")


def span_id(value: Any) -> int:
    if type(value) is int and 0 <= value < U64:
        return value
    raise Unencodable(f"span id out of range: {value!r}")


def grouped(items: Sequence[T], encode: Callable[[T], E]) -> Groups[E]:
    """``items`` encoded, grouped by resource, then scope, in the order each first appears, as the
    SDK's encoders group them: dicts keyed by the SDK objects (equal resources share a group);
    each distinct resource and scope object is hashed once, not once per item (a Resource's hash
    json-dumps its attributes)."""
    by_object: dict[tuple[int, int], list[E]] = {}
    groups: Groups[E] = {}
    for item in items:
        resource, scope = item.resource, item.instrumentation_scope or None
        out = by_object.get((id(resource), id(scope)))
        if out is None:  # items hold their resource and scope: the ids stay theirs for the batch
            out = by_object[id(resource), id(scope)] = groups.setdefault(resource, {}).setdefault(scope, [])
        out.append(encode(item))
    return groups


def checked(write: Callable[[], E]) -> E:
    """``write()``, any error but :class:`Unencodable` raised as one: malformed input (a span without a
    kind, a None trace_flags) is a signal for the caller to take the SDK's path, which decides."""
    try:
        return write()
    except Unencodable:
        raise
    except Exception as exc:
        raise Unencodable(f"{type(exc).__name__}: {exc}") from exc
