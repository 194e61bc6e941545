"""AppSpan / AppPoint (otel_ebpf/receivers/apptrace) -> SpanRecord / MetricRecord; the rest passes unchanged.

* AppSpan -> span ``<name>`` (scope ``otel_ebpf.apptrace``) with the SDK's ids: the app's trace
  id, the SDK span id, and the app span current at the begin as parent. CUDA spans of that
  thread inside it have it as parent (otel_ebpf/processors/cuda reads ``ctx.app_context``).
* AppPoint -> a zero-length span ``<name>`` in the app's trace (``point_spans``), and the
  counter ``app.tracepoint.fires`` {fire} by app.tracepoint.provider / app.tracepoint.name.

Attributes: ``app.tracepoint.provider``, ``thread.id``, and ``app.arg.<name>`` per argument.
Threading: single-threaded (the pipeline worker); ``consume`` never raises.
"""
from __future__ import annotations

from typing import Any

from otel_ebpf.core.events import SpanRecord
from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles

from ...receivers.apptrace.events import AppPoint, AppSpan
from .config import Config

__all__ = ["METRICS", "SCOPE", "AppTraceProcessor"]

SCOPE = "otel_ebpf.apptrace"
METRICS: dict[str, MetricSpec] = {
    "app.tracepoint.fires": ("counter", "{fire}", "Application tracepoint fires."),
}


class AppTraceProcessor(EventProcessor[Config]):
    """Processor ``apptrace``."""

    NAME = "apptrace"
    SCOPE = SCOPE
    METRICS = METRICS

    @handles(AppSpan, AppPoint)
    def _app(self, ev: AppSpan | AppPoint, out: list[object]) -> None:
        attrs: dict[str, Any] = {"app.tracepoint.provider": ev.provider, "thread.id": ev.tid}
        attrs.update((f"app.arg.{k}", v) for k, v in ev.attributes)
        parent = ev.parent_span_id or None
        if isinstance(ev, AppSpan):
            out.append(SpanRecord(ev.pid, ev.name, ev.start_ns, ev.end_ns, attrs, scope=SCOPE,
                                  trace_id=ev.trace_id, span_id=ev.span_id, parent_span_id=parent))
            return
        if self.config.point_spans:
            out.append(SpanRecord(ev.pid, ev.name, ev.time_ns, ev.time_ns, attrs, scope=SCOPE,
                                  trace_id=ev.trace_id or None, parent_span_id=parent if ev.trace_id else None))
        self.metric(out, ev.pid, "app.tracepoint.fires", 1,
                    {"app.tracepoint.provider": ev.provider, "app.tracepoint.name": ev.name})
