"""Which application span is current on a thread, at a given time: set by the apptrace
receiver from begin/end fires, read by processors that parent their spans on it (cuda).

Lives on :attr:`otel_ebpf.core.pipeline.Context.app_context`. Intervals are kept per (pid, tid):
an open one (begin seen, end not yet) matches every later time; closed ones are kept (the
last :data:`PER_THREAD` per thread) because another receiver's records of the same time may
be processed after the end was read. The innermost (latest begun) interval that contains the
time wins, so nested ``tp.span`` blocks nest. Limit: a record processed before the begin
record of its interval was read gets no parent (begin records wake the reader at once).

Thread-safe (the receiver's poll thread writes, the pipeline worker reads); bounded: at most
``max_threads`` threads (least recently begun evicted, counted as reason=context_store_full).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from otel_ebpf.core.telemetry import Telemetry

__all__ = ["PER_THREAD", "AppContextStore"]

PER_THREAD = 64


@dataclass(slots=True)
class _Interval:
    start_ns: int
    end_ns: int | None
    trace_id: int
    span_id: int


class AppContextStore:
    """(pid, tid, time) -> (trace_id, span_id) of the app span current then, or None."""

    def __init__(self, telemetry: Telemetry, *, max_threads: int = 16384, name: str = "apptrace") -> None:
        self._telemetry, self._name, self._max = telemetry, name, max_threads
        self._threads: OrderedDict[tuple[int, int], list[_Interval]] = OrderedDict()
        self._lock = threading.Lock()

    def begin(self, pid: int, tid: int, start_ns: int, trace_id: int, span_id: int) -> None:
        key = (pid, tid)
        with self._lock:
            spans = self._threads.get(key)
            if spans is None:
                if len(self._threads) >= self._max:
                    self._threads.popitem(last=False)
                    self._telemetry.dropped(self._name, "context_store_full")
                spans = self._threads[key] = []
            else:
                self._threads.move_to_end(key)
            spans.append(_Interval(start_ns, None, trace_id, span_id))
            if len(spans) > PER_THREAD:
                closed = next((i for i, s in enumerate(spans) if s.end_ns is not None), 0)
                del spans[closed]

    def end(self, pid: int, tid: int, span_id: int, end_ns: int) -> None:
        with self._lock:
            for s in reversed(self._threads.get((pid, tid), ())):
                if s.span_id == span_id and s.end_ns is None:
                    s.end_ns = end_ns
                    return

    def lookup(self, pid: int, tid: int, time_ns: int) -> tuple[int, int] | None:
        """The innermost app span of thread ``tid`` containing ``time_ns``."""
        with self._lock:
            for s in reversed(self._threads.get((pid, tid), ())):
                if s.start_ns <= time_ns and (s.end_ns is None or time_ns <= s.end_ns):
                    return s.trace_id, s.span_id
        return None

    def __len__(self) -> int:
        return len(self._threads)
