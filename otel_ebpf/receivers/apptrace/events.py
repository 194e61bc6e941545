"""Typed events of the application tracepoints receiver (otel_ebpf/receivers/apptrace).

Times are Unix epoch ns. ``trace_id`` is the application's trace (128-bit int, never 0 for
spans: the SDK starts a trace when the app has none); ``parent_span_id`` is the app's span
that was current at the fire (0: none). ``attributes`` are the probe's arguments decoded from
its JSON payload, as (name, value) pairs.
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = ["AppPoint", "AppSpan"]

AppArgs = tuple[tuple[str, str | int | float | bool], ...]


@fast_init
@dataclass(frozen=True, slots=True)
class AppPoint:
    """A point probe fired (``Probe.fire``)."""

    pid: int
    tid: int
    provider: str
    name: str
    time_ns: int
    trace_id: int
    parent_span_id: int
    attributes: AppArgs


@fast_init
@dataclass(frozen=True, slots=True)
class AppSpan:
    """A ``Provider.span`` block ended; its begin carried the attributes."""

    pid: int
    tid: int
    provider: str
    name: str
    start_ns: int
    end_ns: int
    trace_id: int
    span_id: int
    parent_span_id: int
    attributes: AppArgs
