"""What the kernel reported about a process's fork and exec, kept for when ``/proc`` is gone.

A process that exits within milliseconds of its exec (``/bin/true`` in a shell loop) is gone
before the agent reads ``/proc/PID``, yet a receiver saw its fork (parent pid) and its exec
(file name and argv, read in the kernel). :class:`ExecHints` keeps that, one entry per pid, for
:class:`otel_ebpf.host.processes.ResourceCache` to fill the resource with (``ResourceCache.hint``
builds the attributes: redacted and capped exactly as ``/proc``-derived ones).

PID reuse: a fork record starts a new entry for its pid (the old process's hint is dropped and
counted in ``stale``); a cache entry whose ``/proc`` start time is later than the hint's exec is
another process (:func:`describes`). Bounded: at most ``max_entries`` pids, least recently
hinted dropped first (counted in ``evictions``). Times are ``bpf_ktime_get_ns()``
(CLOCK_MONOTONIC ns, the same clock as :func:`time.monotonic_ns`). Thread-safe: one lock.
"""
from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from opentelemetry.semconv._incubating.attributes import process_attributes as _proc
from opentelemetry.semconv.attributes.service_attributes import SERVICE_NAME

from otel_ebpf.host.attributes import Attributes

__all__ = ["PROGRAM_KEYS", "ExecHint", "ExecHints", "apply_hint", "describes"]

#: What an exec changes, and the kernel's exec record tells.
PROGRAM_KEYS = (_proc.PROCESS_COMMAND_LINE, _proc.PROCESS_COMMAND_ARGS, _proc.PROCESS_EXECUTABLE_PATH,
                _proc.PROCESS_EXECUTABLE_NAME)
_TICK_NS = 1_000_000_000 // (os.sysconf("SC_CLK_TCK") or 100)


@dataclass(frozen=True, slots=True)
class ExecHint:
    """The kernel's view of one process: ``start_ns`` its fork (None: not seen), ``exec_ns`` its
    last exec (None: none seen), ``attrs`` parent pid and program attributes (ready to export)."""

    start_ns: int | None
    exec_ns: int | None
    attrs: Attributes


class ExecHints:
    """Bounded LRU of :class:`ExecHint` by pid. ``evictions``: dropped for room; ``stale``:
    dropped because a fork reused the pid. Plain ints, read without the lock."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max(1, max_entries)
        self._hints: OrderedDict[int, ExecHint] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = self.stale = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._hints)

    def fork(self, pid: int, time_ns: int, attrs: Attributes) -> None:
        """A new process ``pid`` began at ``time_ns``: whatever was known of the pid is another process's."""
        with self._lock:
            if self._hints.pop(pid, None) is not None:
                self.stale += 1
            self._put(pid, ExecHint(time_ns, None, dict(attrs)))

    def exec(self, pid: int, time_ns: int, attrs: Attributes) -> None:
        """``pid`` exec'd at ``time_ns`` a program of ``attrs``: replaces the program attributes,
        keeps the parent pid and fork time learnt before (an exec keeps both)."""
        with self._lock:
            old = self._hints.pop(pid, None)
            kept: Attributes = {}
            start = None
            if old is not None and (old.exec_ns is None or old.exec_ns <= time_ns):
                kept = {k: v for k, v in old.attrs.items() if k not in PROGRAM_KEYS}
                start = old.start_ns
            self._put(pid, ExecHint(start, time_ns, {**kept, **attrs}))

    def get(self, pid: int) -> ExecHint | None:
        with self._lock:
            return self._hints.get(pid)

    def _put(self, pid: int, hint: ExecHint) -> None:
        self._hints[pid] = hint
        while len(self._hints) > self.max_entries:
            self._hints.popitem(last=False)
            self.evictions += 1


def describes(hint: ExecHint, start_ticks: int) -> bool:
    """Whether ``hint`` can be of the process whose ``/proc/PID/stat`` start time is ``start_ticks``
    (clock ticks of CLOCK_BOOTTIME): it started no later than the hint's exec (or fork). The
    boottime-monotonic offset is taken now (a suspend between start and now only refuses a hint)."""
    at = hint.exec_ns if hint.exec_ns is not None else hint.start_ns
    if at is None:
        return False
    offset = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()
    return start_ticks * _TICK_NS - offset <= at


def apply_hint(attrs: Attributes, hint: ExecHint, *, after_exec: bool) -> Attributes:
    """``attrs`` (a ``/proc`` read, possibly empty) completed by ``hint``: a new dict. ``after_exec``
    (the read began after the exec) keeps every attribute read and only fills gaps; otherwise the
    read may show the program before the exec, whose program attributes (:data:`PROGRAM_KEYS`)
    are dropped for the hint's.
    ``service.name`` derived from the old executable name (or ``unknown_service``) follows the new one."""
    out = dict(attrs)
    old_name = out.get(_proc.PROCESS_EXECUTABLE_NAME)
    if not after_exec:
        for key in PROGRAM_KEYS:
            out.pop(key, None)
    for key, value in hint.attrs.items():
        out.setdefault(key, value)
    new_name = out.get(_proc.PROCESS_EXECUTABLE_NAME)
    if new_name and out.get(SERVICE_NAME) in (old_name, "unknown_service", None):
        out[SERVICE_NAME] = new_name
    return out
