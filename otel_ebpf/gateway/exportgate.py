"""Backpressure from the gateway's exporters to its receivers.

The exporters' span queues (:class:`~otel_ebpf.emit.sending.SendingQueue`, one per exporter)
never wait: a full one counts what does not fit as ``export_queue_full``. In the gateway, which
has upstream senders that can retry, that would turn a slow or stalled collector into loss. So
the :class:`ExportGate` sits between the last processor and the Forwarder and holds each batch
until every exporter's span queue has room for it (up to ``max_wait``). While it holds, the
gateway's trace queue fills and its OTLP receiver refuses requests (UNAVAILABLE / 503 with a
retry hint): the loss, if any, moves to the agents, which count it, and the pause propagates no
further than their own bounded queues.

::

    collective_join -> ExportGate (waits for room) -> Forwarder -> span queue per exporter

Contract: ``consume`` blocks the calling pipeline worker, at most ``max_wait`` per chunk of at
most the smallest queue capacity; then the chunk is passed on anyway (the exporter counts what
does not fit). :meth:`release` (gateway shutdown) bounds every wait from then on. Events
that are not spans (the join's metric records, ticks) are counted as needing room too: a
handful per batch, so the gate errs towards waiting. Metrics (``MetricsData``) do not pass
here: their queues drop the oldest collection, which the next cumulative one supersedes.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from otel_ebpf.core.pipeline import Consumer

__all__ = ["ExportGate", "RoomQueue"]

_POLL_S = 0.01


class RoomQueue(Protocol):
    capacity: int

    def size(self) -> int: ...


class ExportGate:
    """Consumer that waits for room in ``queues()`` before handing a chunk to ``next_``.

    ``queues``: called for each chunk, so queues made after the gate are seen. Thread-safe;
    normally one pipeline worker calls it. ``waits`` / ``expired``: chunks that had to wait /
    that were passed on still without room (read by tests and the gateway summary)."""

    def __init__(self, next_: Consumer, queues: Callable[[], Sequence[RoomQueue]], *, max_wait: float) -> None:
        self._next = next_
        self._queues = queues
        self._max_wait = max_wait
        self._released = threading.Event()
        self._release_at = float("inf")  # monotonic time every wait ends, from release()
        self.waits = 0
        self.expired = 0

    def consume(self, events: Sequence[object]) -> None:
        queues = list(self._queues())
        if not queues or self._max_wait <= 0:
            self._next.consume(events)
            return
        step = max(1, min(q.capacity for q in queues))
        for i in range(0, len(events), step):
            chunk = events[i:i + step]
            self._wait_for_room(queues, len(chunk))
            self._next.consume(chunk)

    def _wait_for_room(self, queues: Sequence[RoomQueue], n: int) -> None:
        if self._has_room(queues, n):
            return
        self.waits += 1
        deadline = time.monotonic() + self._max_wait
        while not self._released.wait(_POLL_S):
            if self._has_room(queues, n):
                return
            if time.monotonic() >= min(deadline, self._release_at):
                break
        self.expired += 1

    @staticmethod
    def _has_room(queues: Sequence[Any], n: int) -> bool:
        return all(q.capacity - q.size() >= n for q in queues)

    def release(self, within: float = 0.0) -> None:
        """End every wait, now and from now on, at the latest ``within`` seconds from now (the
        gateway is shutting down: a healthy exporter still gets that long to make room)."""
        self._release_at = min(self._release_at, time.monotonic() + within)
        if within <= 0:
            self._released.set()
