"""One exporter's sending queue: a bounded queue, its own worker thread, batching, retries.

Modelled on the OpenTelemetry Collector's ``exporterhelper`` (``sending_queue`` +
``retry_on_failure``, collector v0.1xx ``exporter/exporterhelper``): the producer never waits,
the queue bounds memory, one worker per queue calls the wire exporter (the SDK's OTLP, file or
Prometheus exporter), so a slow or blackholed exporter delays only its own queue.

::

    put(items) --(full: counted export_queue_full)--> deque --worker--> batch --export()--> wire
                                                                  ^ failed: retry with backoff,
                                                                  | counted export_failed when
                                                                  | max_elapsed_time runs out

Bound: items queued plus the batch in flight never exceed ``capacity``. A full queue either
refuses the new items (spans: the collector's behaviour) or, with ``drop_oldest``, evicts the
oldest queued ones (metrics: a newer cumulative collection supersedes an older one).

Accounting: every item put is eventually either sent or counted lost exactly once, with a
reason: ``export_queue_full`` (no room), ``export_failed`` (retries ran out or were disabled),
``export_shutdown`` (still queued, or in flight, when the shutdown deadline passed; an export
that is still running then and later succeeds is counted lost too, at most one batch).
Spans count in ``otel_ebpf.events.dropped{receiver=<exporter>, reason}``, log records in
``otel_ebpf.events.dropped{receiver=<exporter>, reason, signal=logs}`` (events too, so they are in
every drop total; the ``signal`` tells them apart), metric collections in
``otel_ebpf.metrics.dropped{exporter, reason}``; every failed export attempt (retries included)
in ``otel_ebpf.export.failed{signal, exporter}``.

Shutdown: nothing is retried once closing (the Collector's ``retry_sender`` stops at shutdown too):
each queued batch gets one attempt, and after a failed one the rest is counted ``export_failed``
at once. A queue whose last attempt failed (:attr:`SendingQueue.failing`, also set before any
attempt when the endpoint could not be reached at start) gets no attempt at all: :meth:`join`
aborts it at once, its items counted ``export_failed``. So an exporter that is down when the job
ends costs at most one wire exporter call (its own timeout), not ``service.shutdown_timeout``.
:attr:`SendingQueue.lost` keeps this queue's own losses by reason for the end-of-run summary.

Retry backoff: ``initial_interval``, multiplied by 1.5 after each failure up to
``max_interval``, each wait randomized by +-50 % (the collector's ``multiplier`` and
``randomization_factor`` defaults). The SDK's OTLP exporters retry inside one ``export`` call
too (1, 2, 4 s until their ``timeout``); these retries come on top, between such calls.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from otel_ebpf.core.config import doc
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.telemetry import DROPPED, Telemetry

__all__ = ["CURRENT", "METRICS_DROPPED", "RetryConfig", "SendingQueue"]

log = logging.getLogger(__name__)
T = TypeVar("T")
METRICS_DROPPED = "otel_ebpf.metrics.dropped"
_MULTIPLIER = 1.5
_RANDOMIZATION = 0.5
_ABORT_GRACE_S = 2.0  # after the deadline: how long an interrupted export may take to return
_ITEMS = {"spans": "spans", "logs": "log records", "metrics": "metric collections"}
CURRENT = threading.local()  # .queue: the SendingQueue whose worker runs on this thread


@dataclass
class RetryConfig:
    enabled: bool = doc(True, "Retry a batch whose export failed (after the exporter's own retries, e.g. the "
                              "OTLP exporter's within its timeout) instead of dropping it at once.")
    initial_interval: float = doc(1.0, "Wait after the first failure; x1.5 after each further one, +-50 % jitter.",
                                  duration=True)
    max_interval: float = doc(5.0, "Longest wait between two attempts: bounds how late a batch goes out after the "
                                   "endpoint is back.", duration=True)
    max_elapsed_time: float = doc(300.0, "Longest a batch is retried; then it is dropped and counted "
                                         "(reason export_failed). 0: until shutdown. Meanwhile the queue fills "
                                         "and further items are counted export_queue_full.", duration=True)

    def validate(self, path: str) -> None:
        if self.initial_interval <= 0:
            raise ConfigError(f"{path}.initial_interval", f"must be > 0, got {self.initial_interval}s")
        if self.max_interval < self.initial_interval:
            raise ConfigError(f"{path}.max_interval",
                              f"must be >= initial_interval ({self.initial_interval}s), got {self.max_interval}s")
        if self.max_elapsed_time > 86_400:
            raise ConfigError(f"{path}.max_elapsed_time", f"must be <= 24h, got {self.max_elapsed_time}s")


class SendingQueue(Generic[T]):
    """A bounded queue of items for one wire exporter, drained by its own daemon thread.

    ``export(batch) -> bool`` is called on the worker thread only, one batch at a time; False or
    an exception is a failed attempt. ``close_wire()`` shuts the wire exporter down (the queue
    owns it; the SDK's OTLP exporters also abort an export in progress there). ``signal``
    (``spans``, ``logs`` or ``metrics``) says where losses are counted (module docstring).

    Thread safety: :meth:`put`, :meth:`flush`, :meth:`size` from any thread; :meth:`close` and
    :meth:`join` from one (the owner's shutdown). Blocking: :meth:`put` never waits;
    :meth:`flush` and :meth:`join` wait at most their bound.
    """

    def __init__(self, name: str, signal: str, export: Callable[[list[T]], bool],
                 close_wire: Callable[[], None], telemetry: Telemetry, *, capacity: int, batch_size: int = 1,
                 batch_delay: float = 0.0, retry: RetryConfig | None = None, drop_oldest: bool = False,
                 prepare: Callable[[Sequence[T]], Sequence[T]] | None = None) -> None:
        if capacity < 1 or batch_size < 1:
            raise ValueError("capacity and batch_size must be >= 1")
        self.name, self.signal, self.capacity = name, signal, capacity
        self._export, self._close_wire, self._telemetry = export, close_wire, telemetry
        self._batch_size, self._delay = min(batch_size, capacity), batch_delay
        self._retry = retry or RetryConfig()
        self._drop_oldest = drop_oldest
        self._prepare = prepare
        self._cond = threading.Condition()
        self._items: deque[T] = deque()
        self._inflight: list[T] | None = None
        self._first_at = 0.0  # monotonic time the current partial batch started waiting
        self._flushes = 0
        self._closing = False
        self._abort = threading.Event()
        self._no_retry = threading.Event()  # set by close(): ends a retry wait
        self._wire_closed = False
        self.sent = 0
        self.lost: dict[str, int] = {}  # reason -> items lost (also counted in telemetry)
        self.failing = False  # the last attempt failed (or the endpoint was unreachable at start)
        self._thread = threading.Thread(target=self._run, name=f"otel-ebpf-export-{name}-{signal}", daemon=True)
        self._thread.start()

    # ---- producer side ----------------------------------------------------------------
    def put(self, items: Sequence[T]) -> int:
        """Queue ``items`` without waiting; returns how many were accepted (the rest, and with
        ``drop_oldest`` the evicted, are counted lost). With ``prepare`` (an OTLP exporter's
        encode_ahead), the items there looks to be room for are handed to it first, on the caller's
        thread and outside the lock, and queued as it returns them (the same number, in order)."""
        if not items:
            return 0
        if self._prepare is not None:
            items = self._prepared(items)
        evicted = 0
        with self._cond:
            closing = self._closing
            if closing:
                accepted = 0
            else:
                room = self.capacity - len(self._items) - len(self._inflight or ())
                if self._drop_oldest:
                    while room < len(items) and self._items:
                        self._items.popleft()
                        evicted += 1
                        room += 1
                accepted = max(0, min(room, len(items)))
                if accepted:
                    was_empty = not self._items
                    if was_empty:
                        self._first_at = time.monotonic()
                    self._items.extend(items[:accepted] if accepted < len(items) else items)
                    if was_empty or len(self._items) >= self._batch_size:
                        self._cond.notify()
        refused = len(items) - accepted
        if closing:
            self._lost(refused, "export_shutdown")
        else:
            self._lost(evicted + refused, "export_queue_full")
        return accepted

    def _prepared(self, items: Sequence[T]) -> Sequence[T]:
        """``items`` with as many as there looks to be room for (read without the lock: refused ones are not worth
        preparing, and an item left as it is is queued as it is) given to ``prepare``; all of them as they are if it
        fails."""
        assert self._prepare is not None
        room = len(items) if self._drop_oldest else self.capacity - len(self._items) - len(self._inflight or ())
        if room <= 0:
            return items
        try:
            if room >= len(items):
                return self._prepare(items)
            return [*self._prepare(items[:room]), *items[room:]]
        except Exception:  # never raise into the producer: the exporter encodes them as it would have
            log.debug("%s: preparing %s for the queue failed", self.name, self.signal, exc_info=True)
            return items

    def size(self) -> int:
        """Items queued plus the batch in flight (what ``capacity`` bounds)."""
        with self._cond:
            return len(self._items) + len(self._inflight or ())

    def flush(self, timeout_s: float) -> bool:
        """Send what is queued now (no batch delay); wait until nothing is queued or in flight.
        False when ``timeout_s`` passed first (e.g. a batch is being retried)."""
        end = time.monotonic() + timeout_s
        with self._cond:
            self._flushes += 1
            self._cond.notify_all()
            try:
                while self._items or self._inflight is not None:
                    left = end - time.monotonic()
                    if left <= 0 or not self._thread.is_alive():
                        return False
                    self._cond.wait(left)
                return True
            finally:
                self._flushes -= 1

    # ---- shutdown -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop accepting; the worker sends what is queued (no batch delay) and exits."""
        with self._cond:
            self._closing = True
            self._no_retry.set()
            self._cond.notify_all()

    def join(self, deadline: float) -> int:
        """Wait until the worker has sent everything or ``deadline`` (monotonic) passed; then
        stop retries, shut the wire exporter down (interrupting an export in progress) and
        count what is left as ``export_shutdown`` (``export_failed`` for a failing queue, which is not
        waited for). Returns that count."""
        self.close()
        down = self.failing
        if not down:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._abort.set()
            with self._cond:
                self._cond.notify_all()
        self._shut_wire()
        self._thread.join(_ABORT_GRACE_S if self._abort.is_set() else 0.0)
        with self._cond:
            left = len(self._items) + len(self._inflight or ())
            self._items.clear()
            self._inflight = None
            self._cond.notify_all()
        if left and down:
            log.info("%s exporter %s: %d %s not sent: the exporter was failing at shutdown", self.signal,
                     self.name, left, _ITEMS.get(self.signal, "items"))
            self._lost(left, "export_failed")
        elif left:
            log.warning("%s exporter %s: %d %s not sent by the shutdown deadline", self.signal, self.name, left,
                        _ITEMS.get(self.signal, "items"))
            self._lost(left, "export_shutdown")
        return left

    def _shut_wire(self) -> None:
        with self._cond:
            if self._wire_closed:
                return
            self._wire_closed = True
        try:
            self._close_wire()
        except Exception:
            log.debug("%s exporter %s: shutdown failed", self.signal, self.name, exc_info=True)

    # ---- worker -------------------------------------------------------------------------
    def _run(self) -> None:
        CURRENT.queue = self  # read by emit.sdklog: which exporter the SDK's log records are about
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            sent = self._send(batch)
            with self._cond:
                mine = self._inflight is batch  # else join() took it and counted it
                self._inflight = None
                self._cond.notify_all()
            if mine:
                if sent:
                    self.sent += len(batch)
                else:
                    self._lost(len(batch), "export_failed")
                    if self._closing and not self._abort.is_set():  # no retries at shutdown: the rest goes too
                        self._drop_queued("export_failed")

    def _next_batch(self) -> list[T] | None:
        with self._cond:
            while True:
                if self._abort.is_set():
                    return None
                n = len(self._items)
                now = time.monotonic()
                if n and (n >= self._batch_size or self._closing or self._flushes
                          or now >= self._first_at + self._delay):
                    if n <= self._batch_size:  # all of it, copied in C rather than a popleft a span in Python
                        batch = list(self._items)
                        self._items.clear()
                    else:
                        batch = [self._items.popleft() for _ in range(self._batch_size)]
                    self._inflight = batch
                    if self._items:  # the rest wait for a full batch or their own delay
                        self._first_at = now
                    return batch
                if not n and self._closing:
                    return None
                self._cond.wait(None if not n else self._first_at + self._delay - now)

    def _drop_queued(self, reason: str) -> None:
        with self._cond:
            n = len(self._items)
            self._items.clear()
            self._cond.notify_all()
        self._lost(n, reason)

    def _attempt(self, batch: list[T]) -> bool:
        try:
            ok = bool(self._export(batch))
        except Exception:
            log.warning("%s export to %s failed", self.signal, self.name, exc_info=True)
            ok = False
        if not ok:
            self._telemetry.add("otel_ebpf.export.failed", 1, signal=self.signal, exporter=self.name)
        self.failing = not ok
        return ok

    def _send(self, batch: list[T]) -> bool:
        """Export ``batch``, retrying with backoff while the retry policy allows."""
        retry, start = self._retry, time.monotonic()
        interval = retry.initial_interval
        while True:
            if self._attempt(batch):
                return True
            if not retry.enabled or self._abort.is_set() or self._no_retry.is_set():
                return False
            wait = interval * (1 + _RANDOMIZATION * (2 * random.random() - 1))
            if retry.max_elapsed_time > 0 and time.monotonic() - start + wait > retry.max_elapsed_time:
                log.warning("%s export to %s: giving up a batch of %d after %.0fs of retries", self.signal,
                            self.name, len(batch), time.monotonic() - start)
                return False
            if self._no_retry.wait(wait) or self._abort.is_set():
                return False
            interval = min(interval * _MULTIPLIER, retry.max_interval)

    def _lost(self, n: int, reason: str) -> None:
        if n <= 0:
            return
        with self._cond:
            self.lost[reason] = self.lost.get(reason, 0) + n
        if self.signal == "spans":
            self._telemetry.dropped(self.name, reason, n)
        elif self.signal == "logs":
            self._telemetry.add(DROPPED, n, receiver=self.name, reason=reason, signal="logs")
        else:
            self._telemetry.add(METRICS_DROPPED, n, exporter=self.name, reason=reason)
