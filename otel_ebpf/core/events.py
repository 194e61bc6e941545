"""Events shared by every stage, and the records that processors hand to ``emit``.

Receivers define their own event types next to their BPF code (one frozen dataclass per kind,
see ``otel_ebpf/receivers/cuda/events.py``). This module holds the kinds every receiver shares
(process lifecycle, self-telemetry) and the records the emit stage understands:

* :class:`SpanRecord` - one finished span with explicit epoch-ns times and optional
  deterministic ids (the collective join derives trace ids from (comm id, seq)).
* :class:`MetricRecord` - one measurement. ``count > 1`` means the same value was observed
  ``count`` times (in-kernel aggregation), which emit folds into a histogram in O(1).
* :class:`LogRecord` - one OTel log record (a captured stack, a straggler event), owned by a
  process or by the agent.

All records are immutable and cheap; nothing here imports the OTel SDK.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from otel_ebpf.core.frozen import fast_init

__all__ = [
    "AttrValue",
    "Attributes",
    "LibraryLoaded",
    "LogRecord",
    "MetricKind",
    "MetricRecord",
    "ProcessExit",
    "SpanEventRecord",
    "SpanLinkRecord",
    "SpanRecord",
    "Tick",
]

AttrValue = str | int | float | bool | tuple[Any, ...]
Attributes = Mapping[str, AttrValue]
MetricKind = Literal["counter", "updown", "histogram", "gauge"]


@fast_init
@dataclass(frozen=True, slots=True)
class SpanEventRecord:
    """A timestamped event inside a span (epoch ns)."""

    name: str
    time_ns: int
    attributes: Attributes = field(default_factory=dict)


@fast_init
@dataclass(frozen=True, slots=True)
class SpanLinkRecord:
    """A link to another span (e.g. a ncclSend to its matching ncclRecv)."""

    trace_id: int
    span_id: int
    attributes: Attributes = field(default_factory=dict)


@fast_init
@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One finished span, owned by the process ``pid`` (its resource).

    ``trace_id``/``span_id``/``parent_span_id`` left as None get random ids (a new trace
    unless a parent is given). ``error`` set means status ERROR with that description.
    ``comm`` names the process when /proc has already lost it.
    """

    pid: int
    name: str
    start_ns: int
    end_ns: int
    attributes: Attributes
    scope: str = "otel_ebpf"
    kind: Literal["internal", "client", "server", "producer", "consumer"] = "internal"
    trace_id: int | None = None
    span_id: int | None = None
    parent_span_id: int | None = None
    error: str | None = None
    events: tuple[SpanEventRecord, ...] = ()
    links: tuple[SpanLinkRecord, ...] = ()
    comm: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class MetricRecord:
    """One measurement for process ``pid`` (None: the agent's own resource).

    counter/updown: ``value`` is a delta. gauge: the current value. histogram: ``value`` was
    observed ``count`` times, or, with ``buckets``, ``count`` observations summing to ``value``
    fell into these buckets of the emitter's bounds for ``unit``
    (``otel_ebpf.core.buckets.bounds_for_unit``; ``len(bounds) + 1`` counts: in-kernel
    histograms). ``unit`` uses UCUM as in OTel semantic conventions.
    """

    pid: int | None
    name: str
    kind: MetricKind
    value: float
    attributes: Attributes
    unit: str = "1"
    description: str = ""
    scope: str = "otel_ebpf"
    count: int = 1
    comm: str | None = None
    buckets: tuple[int, ...] | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class LogRecord:
    """One log record for process ``pid`` (None: the agent's own resource), epoch-ns ``time_ns``.

    ``event_name`` is the OTel log record's EventName (``otel_ebpf.nccl.rank.stack``); ``severity`` an
    OTel severity text (TRACE, DEBUG, INFO, WARN, ERROR, FATAL); ``body`` a string; ``trace_id``/``span_id``
    tie it to a span (0: none). ``comm`` names the process when /proc has already lost it.
    """

    pid: int | None
    time_ns: int
    event_name: str
    body: str
    attributes: Attributes
    severity: Literal["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"] = "INFO"
    scope: str = "otel_ebpf"
    trace_id: int = 0
    span_id: int = 0
    comm: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class ProcessExit:
    """A traced process (thread group) ended. Emitted by every BPF receiver's common part;
    ``source`` names that receiver. Its own ring buffer orders the exit after the process's
    last records of that receiver, but not after another receiver's: a processor that frees
    per-process state acts on the exit from its own receiver only."""

    pid: int
    time_ns: int
    comm: str
    exit_code: int
    source: str = ""


@fast_init
@dataclass(frozen=True, slots=True)
class LibraryLoaded:
    """A traced process opened a library a receiver watches (before it is mapped)."""

    pid: int
    tid: int
    time_ns: int
    path: str


@fast_init
@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (epoch ns). A driver sends it periodically so stages with timeouts act while
    no data arrives (a hung NCCL job sends nothing). Stages pass it on like any other event."""

    time_ns: int

