"""The skeleton every simple processor shares: lifecycle, the dispatch loop and metric records.

A processor subclasses :class:`EventProcessor` and marks each handler method with
:func:`handles` (the event types it takes). ``consume`` walks the batch in order: an event whose exact type has
a handler goes to it (the handler appends what it makes to ``out``); any other event is passed
on unchanged, in place. A handler that raises loses that event only: the drop is counted as
``otel_ebpf.events.dropped{receiver=<NAME>, reason=<ERROR_REASON>}`` and the loop goes on.
One ``next.consume(out)`` per batch, none for an empty result.

Processors with state keep it in their own attributes and override ``shutdown`` to flush it.
Nothing here touches the OTel SDK: processors hand :class:`~otel_ebpf.core.events.MetricRecord` /
``SpanRecord`` to ``emit``.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from otel_ebpf.core.events import Attributes, MetricKind, MetricRecord
from otel_ebpf.core.pipeline import Consumer, Context

__all__ = ["EventProcessor", "MetricSpec", "handles", "metric_record"]

log = logging.getLogger(__name__)
ConfigT = TypeVar("ConfigT")
HandlerT = TypeVar("HandlerT", bound=Callable[..., None])
# metric name -> (kind, UCUM unit, description), the METRICS tables of the processors
MetricSpec = tuple[MetricKind, str, str]


def metric_record(table: Mapping[str, MetricSpec], scope: str, pid: int | None, name: str, value: float,
                  attributes: Attributes | None = None, count: int = 1) -> MetricRecord:
    """The MetricRecord for ``name`` with the kind, unit and description its ``table`` row gives.
    ``attributes`` None: a fresh empty dict. Raises KeyError for a name not in the table."""
    kind, unit, description = table[name]
    return MetricRecord(pid, name, kind, value, {} if attributes is None else attributes, unit=unit,
                        description=description, scope=scope, count=count)


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
    marked with :func:`handles`, and optionally ``SCOPE`` and ``METRICS`` for :meth:`metric`.

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

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def consume(self, events: Sequence[object]) -> None:
        out: list[object] = []
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
                self._telemetry.dropped(self.NAME, self.ERROR_REASON)
        if out:
            self._next.consume(out)

    def metric(self, out: list[object], pid: int | None, name: str, value: float,
               attributes: Attributes | None = None, count: int = 1) -> None:
        """Append the record of ``name`` from this processor's ``METRICS`` table, in its ``SCOPE``."""
        out.append(metric_record(self.METRICS, self.SCOPE, pid, name, value, attributes, count))
