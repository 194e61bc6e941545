"""The Python API: trace a command or running processes from a notebook and sample typed events.

::

    import otel_ebpf
    with otel_ebpf.Session(command=["python", "train.py"], receivers=("cuda", "nccl")) as s:
        events = s.sample(seconds=2.0)      # MemcpyCall, SyncCall, NcclCall... (frozen dataclasses)
        s.to_parquet("out/")                # one <TypeName>.parquet per event type sampled so far

A :class:`Session` composes the registered receivers (``otel_ebpf.service.components``) with an
in-memory bounded buffer instead of exporters; no OTel SDK, no files unless asked.
``processed=False`` (default): :meth:`Session.sample` returns the receivers' raw typed events
(``receivers/<name>/events.py``) plus ProcessExit (one per process, whichever receiver's
arrived first: its ``source``) / LibraryLoaded. ``processed=True``: the
events first go through the matching processors (``cuda``, ``nccl``), so it returns the
SpanRecord / MetricRecord they make, plus whatever they pass on unchanged.

Lifetime: ``start()`` (or ``with``) loads BPF and attaches, then releases a command (it is held
until every probe is attached, as in ``otel-ebpf run``); ``close()`` (or leaving ``with``)
drains and detaches every probe. A command the session started and that still runs at close
is terminated (SIGTERM, then SIGKILL after ``stop_timeout``); processes given by ``pids`` are
left alone. Buffer: at most ``max_events`` events wait between samples; what does not fit is
dropped, counted in :attr:`Session.dropped` and in ``otel_ebpf.events.dropped{receiver="api",
reason="buffer_full"}``. Needs root (or CAP_BPF + CAP_PERFMON) and BCC, like the agent.
Not thread-safe: one thread drives a session (the receivers' own threads feed the buffer).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from otel_ebpf.service import components
from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError, OtelEbpfError, TargetError
from otel_ebpf.core.events import ProcessExit
from otel_ebpf.host.timeline import HostStats
from otel_ebpf.bpf.clock import KernelClock
from otel_ebpf.core.pipeline import BoundedQueue, Consumer, Context
from otel_ebpf.report.otlpfiles import read_otlp_json
from otel_ebpf.core.telemetry import DROPPED

__all__ = ["Session", "read_otlp_json"]

#: another receiver's report of the same exit arrives within a few poll rounds; a pid reused and
#: exited again this soon is taken for the same process (its exit is left out)
_EXIT_DEDUP_NS = 2_000_000_000
_EXIT_GRACE_S = 0.5  # after the last target died: time for the receivers' last poll rounds (0.1 s each)
_API = "api"


class _Buffer:
    """Thread-safe bounded list: receivers' threads add, :meth:`take` empties. Overflow (the
    newest events) is dropped and counted.

    One :class:`ProcessExit` per process: every BPF receiver reports each exit (its ``source``),
    so the first to arrive is kept and the others of the same pid within
    :data:`_EXIT_DEDUP_NS` of it are left out (not counted as lost: nothing is missing)."""

    def __init__(self, ctx: Context, max_events: int) -> None:
        self._ctx, self._max = ctx, max_events
        self._lock = threading.Lock()
        self._items: deque[object] = deque()
        self._exits: OrderedDict[int, int] = OrderedDict()  # pid -> time_ns of the exit kept
        self.dropped = 0

    def _repeated_exit(self, ev: object) -> bool:
        if not isinstance(ev, ProcessExit):
            return False
        kept = self._exits.get(ev.pid)
        if kept is not None and abs(ev.time_ns - kept) < _EXIT_DEDUP_NS:
            return True
        self._exits[ev.pid] = ev.time_ns  # a first exit, or a reused pid's
        self._exits.move_to_end(ev.pid)
        if len(self._exits) > 65536:
            self._exits.popitem(last=False)
        return False

    def consume(self, events: Sequence[object]) -> None:
        with self._lock:
            events = [e for e in events if not self._repeated_exit(e)]
            room = self._max - len(self._items)
            self._items.extend(events[:max(room, 0)])
            lost = len(events) - max(room, 0)
            if lost > 0:
                self.dropped += lost
        if lost > 0:
            self._ctx.telemetry.dropped(_API, "buffer_full", lost)

    def take(self) -> list[object]:
        with self._lock:
            out = list(self._items)
            self._items.clear()
        return out


class Session:
    """Probes on ``command`` (started by the session) or on running ``pids`` and their children.

    ``receivers``: registered receiver types (``otel-ebpf config --defaults`` lists them).
    ``config``: ``{"receivers": {type: {...}}, "processors": {type: {...}}}``, each section
    validated like the YAML config (ConfigError names the key path). Raises TargetError for a
    missing PID or no/both targets, ConfigError for bad config; BPF errors on start.
    """

    def __init__(self, command: Sequence[str] | None = None, pids: Iterable[int] | None = None, *,
                 receivers: Sequence[str] = ("cuda", "nccl"), config: Mapping[str, Any] | None = None,
                 processed: bool = False, max_events: int = 1_000_000, keep: bool = True,
                 stop_timeout: float = 5.0) -> None:
        self.command = list(command or [])
        self.pids = list(pids or [])
        if bool(self.command) == bool(self.pids):
            raise TargetError("give exactly one of command=[...] or pids=[...]")
        if max_events < 1:
            raise ConfigError("max_events", f"must be at least 1, got {max_events}")
        self.processed, self.keep, self.stop_timeout = processed, keep, stop_timeout
        self.ctx = Context(libraries={"command": self.command}, clock=KernelClock())  # one for every receiver
        self.ctx.host_stats = HostStats(self.ctx.telemetry)
        self._buffer = _Buffer(self.ctx, max_events)
        self._max = max_events
        self._rcfgs, self._pcfgs = _configs(receivers, config or {}, processed)
        self.receivers: dict[str, Any] = {}  # type -> receiver (its .bpf is the BCC object while running)
        self._stages: list[Any] = []
        self._child: Any = None
        self._exited_at: float | None = None
        self.exit_code: int | None = None
        self.collected: list[object] = []  # what sample() returned, bounded by max_events (keep=True)
        self._started = self._closed = False

    # ---- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        """Load and attach; then release the command. On failure, undo and re-raise."""
        if self._started:
            return
        from otel_ebpf.service.agent import PausedChild
        from otel_ebpf.host.processes import ResourceCache

        for pid in self.pids:
            if pid <= 0 or not os.path.exists(f"/proc/{pid}"):
                raise TargetError(f"no process with PID {pid}")
        self._started = True
        self.ctx.resources = ResourceCache(max_entries=4096)
        try:
            if self.command:
                self._child = PausedChild(self.command)
                self.pids = [self._child.pid]
            self.ctx.target_pids = list(self.pids)
            self._build()
            for stage in self._stages:
                stage.start()
            for r in self.receivers.values():
                r.start()
            from otel_ebpf.bpf.loader import programs_loaded

            programs_loaded(self.ctx)
            if self._child is not None:
                self._child.release()
        except BaseException:
            if self._child is not None:
                self._child.abort()
                self._child = None
            self.close()
            raise

    def _build(self) -> None:
        sink: Consumer = self._buffer
        if self._pcfgs:
            pf = components.processors()
            for ptype, pcfg in reversed(self._pcfgs):
                proc = pf[ptype].create(pcfg, self.ctx, sink)
                self._stages.insert(0, proc)
                sink = proc
            queue = BoundedQueue(sink, self.ctx.telemetry, max_events=self._max, name=_API)
            self._stages.insert(0, queue)
            sink = queue
        rf = components.receivers()
        self.receivers = {rtype: rf[rtype].create(rcfg, self.ctx, sink) for rtype, rcfg in self._rcfgs}

    def close(self) -> None:
        """Drain, detach every probe, stop a command still running. Safe twice and without start."""
        if self._closed:
            return
        self._closed = True
        for r in self.receivers.values():
            r.shutdown()
        for stage in self._stages:  # the queue first: it hands what it holds to the processors
            stage.shutdown()
        self._stop_child()

    def _stop_child(self) -> None:
        if self._child is None or self.exit_code is not None:
            return
        pid = self._child.pid
        for sig, wait in ((signal.SIGTERM, self.stop_timeout), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if self._reap():
                    return
                time.sleep(0.02)

    # ---- targets -----------------------------------------------------------------------
    def _reap(self) -> bool:
        """Whether the command has exited (reaping it and keeping its exit code)."""
        from otel_ebpf.service.agent import exit_status

        if self.exit_code is not None:
            return True
        try:
            pid, status = os.waitpid(self._child.pid, os.WNOHANG)
        except ChildProcessError:
            self.exit_code = -1
            return True
        if pid == 0:
            return False
        self.exit_code = exit_status(status)
        return True

    def alive(self) -> bool:
        """Whether any target process is still running (a zombie is not)."""
        if self._child is not None:
            return not self._reap()
        import psutil

        def running(pid: int) -> bool:
            try:
                return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                return False

        return any(running(p) for p in self.pids)

    # ---- data --------------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Events lost because the buffer (or, with ``processed``, the queue before the
        processors) was full, since start."""
        return self._buffer.dropped + self.ctx.telemetry.get(DROPPED, receiver=_API, reason="queue_full")

    def sample(self, seconds: float = 1.0) -> list[object]:
        """Wait up to ``seconds`` and return every event collected since the previous sample (or
        start), oldest first. Returns early once every target has exited and its last records
        are read. Raises TargetError when every target has exited and nothing is left. After
        close, returns what the final drain left (once), then raises OtelEbpfError."""
        if not self._started:
            raise OtelEbpfError("the session is not running: use 'with Session(...) as s:' (or start())")
        if self._closed:
            rest = self._buffer.take()
            if not rest:
                raise OtelEbpfError("the session is closed (not running) and every event was already returned")
            return self._keep(rest)
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._done():
                break
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))
        for stage in self._stages:
            if isinstance(stage, BoundedQueue):
                stage.flush()
        events = self._buffer.take()
        if not events and self._done():
            what = f"command {self.command[0]!r} (PID {self.pids[0]}) exited with code {self.exit_code}" \
                if self._child is not None else f"PID(s) {', '.join(map(str, self.pids))} exited"
            raise TargetError(f"{what}; every event was already returned, nothing left to sample")
        return self._keep(events)

    def _keep(self, events: list[object]) -> list[object]:
        if self.keep:
            room = max(self._max - len(self.collected), 0)
            self.collected.extend(events[:room])
            if len(events) > room:
                self.ctx.telemetry.dropped(_API, "collected_full", len(events) - room)
        return events

    def _done(self) -> bool:
        if self._exited_at is None:
            if self.alive():
                return False
            self._exited_at = time.monotonic()
        return time.monotonic() - self._exited_at >= _EXIT_GRACE_S

    def to_parquet(self, directory: str | os.PathLike[str]) -> dict[str, Path]:
        """Write :attr:`collected` (everything sample() returned, up to ``max_events``) as one
        ``<TypeName>.parquet`` per event type (otel_ebpf.report.parquet.write_events). Needs pyarrow."""
        from otel_ebpf.report.parquet import write_events

        return write_events(self.collected, directory)


def _configs(receivers: Sequence[str], config: Mapping[str, Any], processed: bool
             ) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """Validated (type, Config) of the receivers and, when ``processed``, of their processors."""
    unknown = set(config) - {"receivers", "processors"}
    if unknown:
        raise ConfigError(sorted(unknown)[0], "unknown key (known: receivers, processors)")
    rf, pf = components.receivers(), components.processors()
    rdata, pdata = config.get("receivers") or {}, config.get("processors") or {}
    for section, data, known in (("receivers", rdata, rf), ("processors", pdata, pf)):
        for key in data:
            if key not in known:
                raise ConfigError(f"{section}.{key}", f"unknown type (known: {', '.join(sorted(known))})")
    if not receivers:
        raise ConfigError("receivers", "name at least one receiver")
    rcfgs: list[tuple[str, Any]] = []
    for rtype in receivers:
        if rtype not in rf:
            raise ConfigError(f"receivers.{rtype}", f"unknown receiver type (known: {', '.join(sorted(rf))})")
        rcfgs.append((rtype, build(rf[rtype].config_class, rdata.get(rtype), f"receivers.{rtype}")))
    pcfgs: list[tuple[str, Any]] = [(t, build(pf[t].config_class, pdata.get(t), f"processors.{t}"))
             for t in pf if processed and t in receivers]
    return rcfgs, pcfgs
