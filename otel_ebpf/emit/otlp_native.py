"""The C span encoders (``otel_ebpf.emit._otlpenc``: ``_otlpenc*.c``), set up for the SDK in use.

``SPANS_PROTO(spans)`` returns the bytes :func:`.otlp_proto.spans_to_otlp_proto` returns and
``SPANS_JSON(spans)`` the line :func:`.otlp_json.spans_to_otlp_json` returns, or None for a batch
off their fast path (those modules then write it in Python, or refuse it); ``SPANS_EACH(spans)`` each
span encoded ahead for SPANS_PROTO (:func:`.otlp_proto.encode_ahead`). All are None when the
extension is not built (it is optional: no C compiler) or when the SDK's enums are not the ones it
maps by position. ``NATIVE`` says whether they are in use.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, StatusCode

__all__ = ["NATIVE", "SPANS_EACH", "SPANS_JSON", "SPANS_PROTO"]

Encoder = Callable[[Sequence[Any]], bytes | None]  # SDK spans and span items (otel_ebpf.emit.spans)
TextEncoder = Callable[[Sequence[Any]], str | None]
EachEncoder = Callable[[Sequence[Any]], list[Any]]


def _load() -> tuple[Encoder, TextEncoder, EachEncoder] | None:
    try:
        from otel_ebpf.emit import _otlpenc  # type: ignore[attr-defined]
    except ImportError:
        return None
    kinds = tuple(sorted(SpanKind, key=lambda k: k.value))
    codes = tuple(sorted(StatusCode, key=lambda c: c.value))
    if [(k.name, k.value) for k in kinds] != [("INTERNAL", 0), ("SERVER", 1), ("CLIENT", 2), ("PRODUCER", 3),
                                              ("CONSUMER", 4)] or [c.value for c in codes] != [0, 1, 2]:
        return None
    _otlpenc.setup(kinds, codes, SpanContext, ReadableSpan)
    return _otlpenc.encode_spans, _otlpenc.encode_spans_json, _otlpenc.encode_each


_LOADED = _load()
SPANS_PROTO: Encoder | None = _LOADED[0] if _LOADED else None
SPANS_JSON: TextEncoder | None = _LOADED[1] if _LOADED else None
SPANS_EACH: EachEncoder | None = _LOADED[2] if _LOADED else None
NATIVE = _LOADED is not None
