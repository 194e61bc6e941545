"""Deferred start (``service.deferred_start``): ``run -- CMD`` starts the command once the receivers
that must see it from its first instruction are loaded (``start_early``: lifecycle, python,
probes, apptrace) and the library gate (otel_ebpf.bpf.gate) holds the libraries of the rest; those
compile one by one in a background thread while the command runs.

* A receiver with a library (cuda, nccl, torch; ``lib_pattern`` and pause_on_load)
  misses nothing: a process that opens its library before it is ready is held by the gate (while
  the compile progresses: see otel_ebpf.bpf.gate), and the starter compiles the receiver a process
  waits for first.
* A receiver without one (blockio, memory, sched, perf) sees the command from the moment it is
  loaded, said in the log with that moment.
* Every receiver started late is handed the processes the command made meanwhile: the in-kernel
  traced set follows fork only from its load, so the starter adds the targets' descendants read
  from /proc (twice: a fork between the first walk and the map update is in the second), and
  attaches to the libraries they have mapped.
* A receiver that fails to start is logged (ERROR) and counted
  (``otel_ebpf.receivers.failed{receiver}``); the job and the other receivers go on, as they
  must once the command runs.
* BCC changes the process's working directory while it compiles, and redirects fd 2 (the
  loader's capture): everything the agent writes after the command started uses absolute paths,
  and ``run`` writes its own lines to a copy of stderr taken before (otel_ebpf.service.run_cmd).

Threading: :meth:`DeferredStart.start` and :meth:`stop` on the agent's thread; the rest on the
starter thread. A receiver is started and added to :attr:`started` under one lock; :meth:`stop`
takes that lock only to read what started, so it never waits for a compile: a receiver whose
compile ends after the stop is shut down by the starter itself.
"""
from __future__ import annotations

import ctypes as ct
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from otel_ebpf.bpf.gate import MAX_PATTERNS, LibraryGate, thread_cpu
from otel_ebpf.bpf.gate_hosted import HostedGate
from otel_ebpf.bpf.loader import programs_loaded
from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.core.pipeline import Context

__all__ = ["RECEIVERS_FAILED", "DeferredStart", "descendants", "plan", "split_start"]

log = logging.getLogger(__name__)
RECEIVERS_FAILED = "otel_ebpf.receivers.failed"


def split_start(receivers: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(early, late): BPF receivers not marked ``start_early`` are late; everything else is early."""
    late = {rid: r for rid, r in receivers.items() if isinstance(r, BpfReceiver) and not r.start_early}
    return {rid: r for rid, r in receivers.items() if rid not in late}, late


def gated(late: dict[str, Any]) -> list[BpfReceiver]:
    """The late receivers the gate holds libraries for (a pattern and pause_on_load), at most
    MAX_PATTERNS; the others with a pattern start early (see DeferredStart)."""
    return [r for r in late.values() if r.lib_pattern and r.pauses_on_load][:MAX_PATTERNS]


def plan(ctx: Context, receivers: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], LibraryGate | None]:
    """(early receivers, late ones, the gate for the late ones' libraries or None). A library
    receiver the gate has no pattern left for starts early."""
    early, late = split_start(receivers)
    watched = gated(late)
    for rid, r in list(late.items()):
        if r.lib_pattern and r.pauses_on_load and r not in watched:
            early[rid] = late.pop(rid)
    # those without a gate first: they miss what happens until they load; the gated ones miss nothing
    # (and one a process waits for is taken first anyway)
    late = {rid: r for rid, r in sorted(late.items(), key=lambda item: item[1] in watched)}
    if not watched:
        return early, late, None
    host = next((r for r in early.values() if getattr(r, "can_host_gate", False)), None)
    if host is None:
        return early, late, LibraryGate(ctx, watched)
    gate = HostedGate(ctx, watched, host)
    host.host_gate(gate)  # one compile: the gate in the host's program (otel_ebpf.bpf.gate_hosted)
    return early, late, gate


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        out[int(d)] = int(stat[stat.rindex(b")") + 2:].split()[1])  # the field after the state: ppid
    return out


def descendants(roots: Sequence[int]) -> list[int]:
    """Every live process whose parent chain reaches one of ``roots`` (roots excluded)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out and child not in roots:
                out.append(child)
                todo.append(child)
    return out


def adopt(receiver: BpfReceiver, roots: Sequence[int]) -> int:
    """Add the processes ``roots`` made before ``receiver`` loaded to its traced set, and attach to
    the libraries they mapped; returns how many processes were added."""
    traced, added = receiver.bpf["traced"], set()
    for _ in range(2):  # a fork between the walk and the update is in the next walk
        for pid in descendants(roots):
            if pid not in added:
                traced[ct.c_uint32(pid)] = ct.c_uint8(1)
                added.add(pid)
    if added:
        for lib in receiver.initial_libraries(sorted(added)):
            receiver.attach_library(lib)
    return len(added)


class DeferredStart:
    """Starts ``late`` receivers on a background thread, releasing ``gate``'s holds as each is ready."""

    def __init__(self, ctx: Context, late: dict[str, Any], gate: LibraryGate | None, released: float) -> None:
        self.ctx, self.late, self.gate = ctx, dict(late), gate
        self.started: dict[str, Any] = {}
        self.failed: dict[str, str] = {}
        self.done = threading.Event()
        self._released = released  # monotonic time the command was let go
        self._stopping = False
        self._lock = threading.Lock()
        self._gate_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="otel-ebpf-deferred-start", daemon=True)

    def start(self) -> None:
        """With nothing late and no gate, the end of the start runs here, before the agent's
        start returns (the compiler's memory is given back by then); else on the thread."""
        if not self.late and self.gate is None:
            self._run()
            return
        if self.gate is not None:
            self.gate.progress = self.cpu_seconds
        self._thread.start()

    def cpu_seconds(self) -> float | None:
        """The starter thread's CPU time (it grows while a receiver compiles); None once it ended."""
        return thread_cpu(self._thread)

    def close_gate(self, finish: bool = False) -> None:
        """Shut the gate down (resuming what it holds), once: at the end of the start, or the agent's shutdown.
        ``finish``: every receiver it watches is ready; the stops still on their way are handled first
        (LibraryGate.finish)."""
        with self._gate_lock:
            gate, self.gate = self.gate, None
        if gate is not None:
            if finish:
                gate.finish()
            else:
                gate.shutdown()

    def finish(self, timeout: float) -> bool:
        """After :meth:`stop`: wait up to ``timeout`` s for the starter thread to end (the compile it is in, then
        that receiver's shutdown); said at INFO when it has to wait. True when it ended."""
        if self.done.is_set() or not self._thread.is_alive():
            return True
        log.info("waiting for the BPF compile in progress to end before exiting (at most %.0fs)", timeout)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("a BPF compile still runs after %.0fs; exiting anyway", timeout)
            return False
        return True

    def stop(self) -> dict[str, Any]:
        """No receiver starts from now on; the ones that did (the agent shuts them down)."""
        with self._lock:
            self._stopping = True
            return dict(self.started)

    def _next(self, pending: dict[str, Any]) -> str:
        gate = self.gate
        want = gate.wanted() if gate is not None else None
        for rid, r in pending.items():
            if r is want:
                return rid
        return next(iter(pending))

    def _run(self) -> None:
        pending = dict(self.late)
        try:
            while pending and not self._stopping:
                rid = self._next(pending)
                self._start_one(rid, pending.pop(rid))
        finally:
            gate = self.gate
            if gate is not None:
                for r in self.late.values():
                    gate.ready(r)  # nothing is held for a receiver that will not come
            programs_loaded(self.ctx)  # no compile of this start is running any more
            try:
                self.close_gate(finish=not self._stopping)  # every receiver watches its own library now
            except Exception:
                log.exception("the library gate failed to stop cleanly")
            self.done.set()

    def _start_one(self, rid: str, r: BpfReceiver) -> None:
        t0 = time.monotonic()
        try:
            r.start()
            with self._lock:
                if self._stopping:  # the agent is shutting down and did not see this one
                    r.shutdown()
                    return
                self.started[rid] = r
            n = adopt(r, self.ctx.target_pids) if self.ctx.target_pids else 0
            log.info("receiver %s started in %.2fs, in the background (%.2fs after the command started%s)", rid,
                     time.monotonic() - t0, time.monotonic() - self._released,
                     f"; {n} process{'es' if n > 1 else ''} it made meanwhile added" if n else "")
        except Exception as exc:  # the command runs: log, count, go on with the others
            self.failed[rid] = str(exc)
            self.ctx.telemetry.add(RECEIVERS_FAILED, 1, receiver=rid)
            log.error("receiver %s could not start: %s; the job goes on without it", rid, exc)
            try:
                r.shutdown()
            except Exception:
                log.debug("receiver %s: shutdown after a failed start", rid, exc_info=True)
        finally:
            gate = self.gate
            if gate is not None:
                gate.ready(r)
