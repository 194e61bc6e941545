"""The capture thread: stack captures off the pipeline worker, one at a time, through a bounded queue.

:meth:`CaptureWorker.submit` (pipeline worker) never blocks: a full queue refuses the job (the caller
counts it). One daemon thread runs the capture function on each job in order and keeps the result
for :meth:`CaptureWorker.take` (pipeline worker). Results are bounded by the jobs submitted: at most
``max_queue`` waiting plus one running. ``start``/``shutdown`` follow the component contract
(shutdown safe without start and twice); jobs not started by the shutdown deadline are returned by
:meth:`shutdown` so the caller can count them.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["CaptureWorker"]

log = logging.getLogger(__name__)
JobT = TypeVar("JobT")
ResultT = TypeVar("ResultT")


class CaptureWorker(Generic[JobT, ResultT]):
    """Runs ``run(job) -> result`` on its own thread. ``run`` must not raise (a raise is logged and
    that job gives no result)."""

    def __init__(self, run: Callable[[JobT], ResultT], max_queue: int, name: str) -> None:
        self._run = run
        self._jobs: queue.Queue[JobT | None] = queue.Queue(maxsize=max_queue)
        self._done: deque[tuple[JobT, ResultT]] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._name = name
        self._stopping = False

    def start(self) -> None:
        if self._thread is None and not self._stopping:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def submit(self, job: JobT) -> bool:
        """Queue ``job``; False (not queued) when the queue is full or the worker is stopping."""
        if self._stopping:
            return False
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            return False
        return True

    def take(self) -> list[tuple[JobT, ResultT]]:
        """The (job, result) pairs finished since the last call, in the order they finished."""
        with self._lock:
            out = list(self._done)
            self._done.clear()
        return out

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                result = self._run(job)
            except Exception:  # a capture must never stop the thread
                log.exception("%s: capture failed", self._name)
                continue
            with self._lock:
                self._done.append((job, result))

    def shutdown(self, timeout: float) -> list[JobT]:
        """Stop after the running capture (waiting up to ``timeout`` s for it); returns the jobs that
        never ran. Safe without start and twice."""
        self._stopping = True
        never: list[JobT] = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                never.append(job)
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)  # room: the queue was just emptied, and submit() refuses now
            thread.join(timeout)
        return never
