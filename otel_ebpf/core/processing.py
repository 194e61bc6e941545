"""The skeleton every simple processor shares: lifecycle, the dispatch loop and metric records.

A processor subclasses :class:`EventProcessor` and marks each handler method with
:func:`handles` (the event types it takes). ``consume`` walks the batch in order: an event whose exact type has
a handler goes to it (the handler appends what it makes to ``out``); any other event is passed
on unchanged, in place. A handler that raises loses that event only (:meth:`EventProcessor.failed`):
the drop is counted as ``otel_ebpf.events.dropped{receiver=<NAME>, reason=<ERROR_REASON>}`` and
the loop goes on. After the batch, :meth:`EventProcessor.end_batch` appends what is due at the
end of every batch (by default the counter sums of :attr:`EventProcessor.sums`, see
:class:`Sums`). One ``next.consume(out)`` per batch, none for an empty result.

Processors with state keep it in their own attributes and override ``shutdown`` to flush it.
Nothing here touches the OTel SDK: processors hand :class:`~otel_ebpf.core.events.MetricRecord` /
``SpanRecord`` to ``emit``.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from otel_ebpf.core.events import Attributes, AttrValue, MetricKind, MetricRecord
from otel_ebpf.core.pipeline import Consumer, Context

__all__ = ["EventProcessor", "MetricSpec", "Sums", "handles", "metric_record"]

log = logging.getLogger(__name__)
ConfigT = TypeVar("ConfigT")
HandlerT = TypeVar("HandlerT", bound=Callable[..., None])
# metric name -> (kind, UCUM unit, description), the METRICS tables of the processors
MetricSpec = tuple[MetricKind, str, str]


def metric_record(table: Mapping[str, MetricSpec], scope: str, pid: int | None, name: str, value: float,
                  attributes: Attributes | None = None, count: int = 1,
                  buckets: tuple[int, ...] | None = None) -> MetricRecord:
    """The MetricRecord for ``name`` with the kind, unit and description its ``table`` row gives.
    ``attributes`` None: a fresh empty dict. Raises KeyError for a name not in the table."""
    kind, unit, description = table[name]
    return MetricRecord(pid, name, kind, value, {} if attributes is None else attributes, unit=unit,
                        description=description, scope=scope, count=count, buckets=buckets)


_SumKey = tuple[int | None, str, tuple[tuple[str, AttrValue], ...]]


class Sums:
    """Counter values summed per (pid, metric name, attributes) over a batch, then flushed as one
    record each: many small increments (one per call) become one delta per series and batch.

    :meth:`add` takes a name of ``table`` (checked at :meth:`flush`: KeyError there); the sum
    starts at int 0, so it keeps the type of what is added (an int sum is exported as an int).
    :meth:`flush` appends the records in first-added order, attributes as a dict in key order,
    and empties the sums. Not thread-safe: owned by one processor on the pipeline worker.
    """

    __slots__ = ("_scope", "_table", "_values")

    def __init__(self, table: Mapping[str, MetricSpec], scope: str) -> None:
        self._table = table
        self._scope = scope
        self._values: dict[_SumKey, float] = {}

    def __len__(self) -> int:
        return len(self._values)

    def add(self, pid: int | None, name: str, value: float, attributes: Mapping[str, AttrValue]) -> None:
        key = (pid, name, tuple(sorted(attributes.items())))
        self._values[key] = self._values.get(key, 0) + value

    def flush(self, out: list[object]) -> None:
        for (pid, name, attrs), value in self._values.items():
            out.append(metric_record(self._table, self._scope, pid, name, value, dict(attrs)))
        self._values.clear()

    def clear(self) -> None:
        self._values.clear()


def handles(*kinds: type) -> Callable[[HandlerT], HandlerT]:
    """Mark a method ``(self, event, out) -> None`` of an :class:`EventProcessor` as the handler
    of events of exactly these types (no subclasses: events are final dataclasses)."""
    if not kinds:
        raise TypeError("handles() needs at least one event type")

    def mark(method: HandlerT) -> HandlerT:
        method.__dict__["_handles"] = kinds
        return method
    return mark


class EventProcessor(Generic[ConfigT]):
    """Base of a processor: ``NAME`` (its type, the ``receiver`` label of its drops), methods
    marked with :func:`handles`, and optionally ``SCOPE`` and ``METRICS`` for :meth:`metric` and
    :attr:`sums` (a :class:`Sums` on that table, flushed by :meth:`end_batch`).

    Threading: single-threaded (the pipeline worker calls ``consume``); ``consume`` never raises
    for a bad event. ``start``/``shutdown`` do nothing here (safe without start and twice).
    """

    NAME: ClassVar[str] = ""
    HANDLERS: ClassVar[Mapping[type, str]] = {}  # event type -> method name, collected from @handles
    ERROR_REASON: ClassVar[str] = "bad_event"
    SCOPE: ClassVar[str] = "otel_ebpf"
    METRICS: ClassVar[Mapping[str, MetricSpec]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.NAME:
            raise TypeError(f"{cls.__name__}: a processor needs a NAME (its type)")
        handlers = dict(cls.HANDLERS)  # inherited ones first; a subclass may take a type over
        own: dict[type, str] = {}
        for attr, value in vars(cls).items():
            for kind in getattr(value, "_handles", ()):
                if kind in own:
                    raise TypeError(f"{cls.__name__}: {kind.__name__} has two handlers, {own[kind]} and {attr}")
                own[kind] = attr
        handlers.update(own)
        cls.HANDLERS = handlers

    def __init__(self, config: ConfigT, ctx: Context, next_: Consumer) -> None:
        self.config = config
        self.ctx = ctx
        self._telemetry = ctx.telemetry
        self._next = next_
        self._handlers: dict[type, Callable[[Any, list[object]], None]] = {
            kind: getattr(self, method) for kind, method in self.HANDLERS.items()}
        self.sums = Sums(self.METRICS, self.SCOPE)

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def consume(self, events: Sequence[object]) -> None:
        out: list[object] = []
        self.dispatch(events, out)
        self.end_batch(out)
        if out:
            self._next.consume(out)

    def dispatch(self, events: Sequence[object], out: list[object]) -> None:
        """Each of ``events`` to its handler, which appends what it passes on to ``out``; an event of no handled type
        is appended as it is, one whose handler raises goes to :meth:`failed`. Never raises."""
        handlers = self._handlers
        for ev in events:
            handler = handlers.get(type(ev))
            if handler is None:
                out.append(ev)
                continue
            try:
                handler(ev, out)
            except Exception:  # hot path: count, never raise
                log.debug("%s: cannot process %r", self.NAME, ev, exc_info=True)
                self.failed(ev, out)

    def failed(self, event: object, out: list[object]) -> None:
        """A handler raised on ``event`` (after appending whatever it did to ``out``): counted as a
        drop. A processor that passes such events on instead overrides this; it must not raise."""
        self._telemetry.dropped(self.NAME, self.ERROR_REASON)

    def end_batch(self, out: list[object]) -> None:
        """Called once after each batch's events, before ``out`` is passed on: appends the
        :attr:`sums` of the batch. Overrides that add timers or pending records call this too."""
        self.sums.flush(out)

    def metric(self, out: list[object], pid: int | None, name: str, value: float,
               attributes: Attributes | None = None, count: int = 1,
               buckets: tuple[int, ...] | None = None) -> None:
        """Append the record of ``name`` from this processor's ``METRICS`` table, in its ``SCOPE``."""
        out.append(metric_record(self.METRICS, self.SCOPE, pid, name, value, attributes, count, buckets))
