"""Stages joined by one consumer interface, after the OTel Collector's component model.

``receiver -> BoundedQueue -> processor -> ... -> processor -> emit``

* Every stage implements :class:`Consumer` (``consume(events)``) and :class:`Component`
  (``start()`` / ``shutdown()``; shutdown is safe without start and safe twice).
* Receivers run their own threads (ring-buffer polling) and hand batches to a
  :class:`BoundedQueue`. One worker thread drains it through the processors, so processors
  are single-threaded and need no locks. A full queue drops the batch and counts it
  (``consume``), or refuses it uncounted for the caller to push back upstream (``offer``).
* A stage passes on every event it does not handle, unchanged.
"""
from __future__ import annotations

import builtins
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from otel_ebpf.core.services import AppContext, CudaThreads, GpuTable, HostTimeline, KernelTime, ProcessResources
from otel_ebpf.core.telemetry import Telemetry

__all__ = [
    "BoundedQueue",
    "Component",
    "Consumer",
    "Context",
    "Factory",
    "Fanout",
    "ListConsumer",
]

log = logging.getLogger(__name__)


@runtime_checkable
class Consumer(Protocol):
    def consume(self, events: Sequence[object]) -> None:
        """Take a batch. Never raises for bad events: count and skip them."""


@runtime_checkable
class Component(Protocol):
    def start(self) -> None: ...

    def shutdown(self) -> None: ...


@dataclass
class Context:
    """What every component may use: self-telemetry, strictness and what to trace.

    ``target_pids`` are the roots of the traced process trees (empty: trace every process
    that loads a watched library). ``libraries`` maps a library key (``cudart``, ``nccl``) to
    paths found before start (config, the command's Python environment, /proc/PID/maps).
    """

    telemetry: Telemetry = field(default_factory=Telemetry)
    strict: bool = False
    target_pids: list[int] = field(default_factory=list)
    follow_children: bool = True
    libraries: dict[str, list[str]] = field(default_factory=dict)
    # The shared services (otel_ebpf.core.services), each made once by whoever builds the context (the
    # Agent, the Python API's Session, the gateway, a test); None: not offered. Components use them only
    # through these Protocols; nothing a receiver owns is reached through them.
    # Kernel monotonic -> epoch ns (otel_ebpf.bpf.clock.KernelClock): one for every receiver of the agent.
    # A context without one gets one from the first BPF receiver made with it (otel_ebpf.bpf.clock.shared).
    clock: KernelTime | None = None
    # Process identity cache (otel_ebpf.host.processes.ResourceCache): receivers fill it as soon as a
    # process is seen (exec, library open, first record), while /proc/PID still describes it.
    resources: ProcessResources | None = None
    # GPU identity (otel_ebpf.host.gpus.GpuResolver): CUDA ordinal -> hw.id, shared by the cuda/nccl processors.
    gpus: GpuTable | None = None
    # Cumulative host counters over time (otel_ebpf.host.timeline.HostStats): sched and other host receivers
    # push samples from their own threads, the nccl processor reads the figures of each step.
    host_stats: HostTimeline | None = None
    # Current application span per thread (otel_ebpf/receivers/apptrace/store.py AppContextStore): set by the apptrace
    # receiver from SDK begin/end fires; cuda (and other) processors parent their spans on it.
    app_context: AppContext | None = None
    # A thread's current CUDA device (the cuda receiver while it runs, otel_ebpf.receivers.cuda): the nccl processor
    # gives a communicator the device of the thread that made it, as NCCL does (cudaGetDevice at init).
    cuda_threads: CudaThreads | None = None
    # Receivers of this agent whose programs write the per-thread call map (oe_thread_ctx: python, torch),
    # added as they are made; the cuda program reads that map only when one exists.
    thread_ctx_writers: set[str] = field(default_factory=set)
    # Longest a process stays stopped by pause_on_load (service.pause_timeout; otel_ebpf.bpf.pauseguard).
    pause_timeout: float = 2.0


@dataclass(frozen=True)
class Factory:
    """``type`` name, its ``Config`` dataclass and ``create(config, ctx, next) -> component``.

    ``default_on``: part of the default pipeline. Components whose cost depends on the workload
    (every Python call, every operator) or that need user input are off by default and are
    enabled by naming them in ``service.pipelines`` (their config section always exists)."""

    type: str
    config_class: builtins.type
    create: Callable[[Any, Context, Consumer], Any]
    description: str = ""
    default_on: bool = True


class ListConsumer:
    """Collects everything it is given (tests, the Python API's ``sample()``). Not bounded:
    callers bound it by draining with :meth:`take`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[object] = []

    def consume(self, events: Sequence[object]) -> None:
        with self._lock:
            self.events.extend(events)

    def take(self) -> list[object]:
        with self._lock:
            out, self.events = self.events, []
        return out

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class Fanout:
    """Sends each batch to several consumers (a receiver used by two pipelines)."""

    def __init__(self, consumers: Sequence[Consumer]) -> None:
        self._consumers = list(consumers)
        self.backpressure = all(getattr(c, "backpressure", False) for c in self._consumers)

    def consume(self, events: Sequence[object], *, block_s: float | None = None) -> None:
        for c in self._consumers:
            if block_s is not None and self.backpressure:
                c.consume(events, block_s=block_s)  # type: ignore[call-arg]
            else:
                c.consume(events)


class BoundedQueue:
    """Thread-safe bounded hand-off from receiver threads to one worker thread.

    ``consume`` does not block unless asked to (``block_s``, used by receiver threads for
    backpressure); a batch that does not fit is dropped and counted as
    ``otel_ebpf.events.dropped{reason=queue_full}``. A batch larger than the whole queue is
    accepted when the queue is empty, so one big poll round never starves. The worker calls
    ``next.consume`` with merged batches; an exception there is logged and counted, and
    the worker goes on. ``shutdown`` drains what is queued before returning, until its deadline:
    what is still queued then is counted ``otel_ebpf.events.dropped{reason=shutdown}``.
    """

    backpressure = True  # consume() accepts block_s

    def __init__(self, next_: Consumer | None, telemetry: Telemetry, *, max_events: int = 65536,
                 name: str = "pipeline") -> None:
        self._next: Consumer | None = next_  # None: connected later (connect), before start
        self._telemetry = telemetry
        self._max = max_events
        self._name = name
        self._items: deque[Sequence[object]] = deque()
        self._size = 0
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._done = 0  # batches handed on (otel_ebpf.service.health tells a stuck worker from a busy one)

    @property
    def progress(self) -> tuple[int, int, str]:
        """(events waiting, batches handed on so far, worker: 'running', 'not started' or 'exited')."""
        with self._cond:
            t = self._thread
            return self._size, self._done, "not started" if t is None else "running" if t.is_alive() else "exited"

    def consume(self, events: Sequence[object], *, block_s: float | None = None) -> None:
        """Queue a batch. With ``block_s`` (receiver threads), wait up to that long for room,
        so a slow pipeline pushes back into the kernel ring buffer instead of dropping here;
        otherwise, or when still full, the batch is dropped and counted (``queue_full``)."""
        if not self.offer(events, block_s=block_s or 0.0):
            self._telemetry.dropped(self._name, "queue_full", len(events))

    def offer(self, events: Sequence[object], *, block_s: float = 0.0) -> bool:
        """Queue the whole batch or none of it, waiting up to ``block_s`` for room; False: not
        queued and *not* counted (the caller refuses it upstream, e.g. an OTLP receiver answering
        UNAVAILABLE so the sender retries). An empty batch is True. Thread-safe."""
        n = len(events)
        if not n:
            return True
        with self._cond:
            if block_s > 0 and self._size + n > self._max and self._size:
                self._cond.wait_for(lambda: self._size + n <= self._max or not self._size or self._stop,
                                    timeout=block_s)
            if self._size + n > self._max and self._size:
                return False
            self._items.append(events)
            self._size += n
            self._cond.notify_all()
            return True

    def connect(self, next_: Consumer) -> None:
        """Where the worker hands batches, for a queue made before its consumer (otel_ebpf.service.stages):
        before :meth:`start`. What was queued meanwhile goes there too."""
        if self._thread is not None:
            raise RuntimeError(f"{self._name}: connect() after start()")
        self._next = next_

    def start(self) -> None:
        if self._next is None:
            raise RuntimeError(f"{self._name}: started before it was connected to a consumer")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"otel-ebpf-{self._name}",
                                            daemon=True)
            self._thread.start()

    def _take(self) -> list[object] | None:
        with self._cond:
            while not self._items and not self._stop:
                self._cond.wait(0.5)
            if not self._items:
                return None
            batch: list[object] = []
            while self._items and len(batch) < 8192:
                batch.extend(self._items.popleft())
            self._size -= len(batch)
            self._cond.notify_all()  # room for blocked producers
            return batch

    def _run(self) -> None:
        nxt = self._next
        assert nxt is not None  # start() checks it
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                nxt.consume(batch)
            except Exception:  # a bad stage must not stop the pipeline
                log.exception("pipeline stage failed on a batch of %d events", len(batch))
                self._telemetry.dropped(self._name, "stage_error", len(batch))
            self._done += 1

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until the queue is empty (the worker may still be finishing its batch)."""
        deadline = threading.Event()
        for _ in range(int(timeout / 0.01)):
            with self._cond:
                if not self._items:
                    return
            deadline.wait(0.01)

    def shutdown(self, deadline: float | None = None) -> None:
        """Hand on what is queued, until ``deadline`` (time.monotonic(); default 30 s from now).
        Events still queued then are counted dropped (reason ``shutdown``); the batch the worker
        holds goes on downstream, whose own shutdown counts what it cannot send."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            wait = 30.0 if deadline is None else max(0.0, deadline - time.monotonic())
            self._thread.join(timeout=wait)
            if self._thread.is_alive():
                with self._cond:
                    left, self._size = self._size, 0
                    self._items.clear()
                if left:
                    log.warning("%s: %d events still queued at the shutdown deadline: dropped", self._name, left)
                    self._telemetry.dropped(self._name, "shutdown", left)
            self._thread = None
        elif self._items and self._next is not None:  # never started: drain synchronously so nothing is lost
            self._run()
        elif self._items:  # never connected (its stages failed to build): nowhere to go
            with self._cond:
                left, self._size = self._size, 0
                self._items.clear()
            self._telemetry.dropped(self._name, "shutdown", left)
