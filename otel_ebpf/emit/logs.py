"""LogRecord -> the SDK's ``ReadableLogRecord``, built directly (no ``LoggerProvider``: records
arrive finished, with their time, resource and scope known, as spans do in :mod:`.spans`).

Mapping (OTel Logs data model): ``time_ns`` -> Timestamp, ObservedTimestamp = when emit built
it; ``severity`` -> SeverityText and SeverityNumber (TRACE 1, DEBUG 5, INFO 9, WARN 13,
ERROR 17, FATAL 21); ``event_name`` -> EventName; ``body`` -> Body (a string);
``attributes`` -> Attributes; ``trace_id``/``span_id`` (0: none) -> TraceId/SpanId, with the
SAMPLED trace flag when a trace id is given (every span emit builds is sampled), no flags
otherwise; ``scope`` -> the instrumentation scope. The resource is the caller's: the
:class:`~otel_ebpf.emit.emitter.Emitter` passes the resource spans of that pid get.

Not thread-safe (one scope cache): the Emitter calls it under its lock. A record whose severity
is not one of the six texts raises KeyError (the Emitter counts it ``bad_record``).
"""
from __future__ import annotations

from opentelemetry._logs import LogRecord as SdkLogRecord
from opentelemetry._logs import SeverityNumber
from opentelemetry.context import Context
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from otel_ebpf.core.events import LogRecord

__all__ = ["SEVERITY_NUMBERS", "LogBuilder", "log_context"]

#: LogRecord.severity -> the OTel SeverityNumber (the first number of each range)
SEVERITY_NUMBERS: dict[str, SeverityNumber] = {
    "TRACE": SeverityNumber.TRACE, "DEBUG": SeverityNumber.DEBUG, "INFO": SeverityNumber.INFO,
    "WARN": SeverityNumber.WARN, "ERROR": SeverityNumber.ERROR, "FATAL": SeverityNumber.FATAL}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NO_FLAGS = TraceFlags(TraceFlags.DEFAULT)


def log_context(trace_id: int, span_id: int, flags: TraceFlags) -> Context:
    """An OTel context carrying exactly these ids, so the SDK's LogRecord takes them and never
    the calling thread's current span (its constructor falls back to that without a context)."""
    span = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags))
    return set_span_in_context(span)


class LogBuilder:
    """Builds SDK log records; one ``InstrumentationScope`` object per scope name."""

    def __init__(self) -> None:
        self._scopes: dict[str, InstrumentationScope] = {}

    def build(self, rec: LogRecord, resource: Resource) -> ReadableLogRecord:
        """The SDK log record of ``rec`` on ``resource``; KeyError for an unknown severity,
        ValueError for an id out of range."""
        number = SEVERITY_NUMBERS[rec.severity]
        if not 0 <= rec.trace_id < 1 << 128 or not 0 <= rec.span_id < 1 << 64:
            raise ValueError(f"trace/span id out of range: {rec.trace_id:#x}/{rec.span_id:#x}")
        scope = self._scopes.get(rec.scope)
        if scope is None:
            scope = self._scopes[rec.scope] = InstrumentationScope(rec.scope)
        context = log_context(rec.trace_id, rec.span_id, _SAMPLED if rec.trace_id else _NO_FLAGS)
        record = SdkLogRecord(timestamp=rec.time_ns, context=context,
                              severity_text=rec.severity, severity_number=number, body=rec.body,
                              attributes=rec.attributes, event_name=rec.event_name)
        return ReadableLogRecord(record, resource, scope)
