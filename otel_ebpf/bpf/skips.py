"""Runs of a receiver's BPF programs that the kernel skipped, from its own per-program counter.

The kernel does not run a perf-attached tracepoint (or kprobe) program on a CPU where another BPF
program is running at the time (``trace_call_bpf``: ``bpf_prog_active``), nor a raw-tracepoint
program that would recurse into itself (``__bpf_trace_run``: ``prog->active``); each such event is
lost to the program, and the kernel counts it in the program's ``recursion_misses``, which
``/proc/<pid>/fdinfo/<prog fd>`` shows (5.12+; 0 or absent where the kernel counts none).
Measured on this project's 6.18 VMs (session 32): the sched receiver's perf-attached
``sched_wakeup`` program was skipped 3-4 times in 4 s (a wakeup made while a BPF program ran on
that CPU); no other program of the lifecycle, cuda (100 uprobe programs) and sched receivers was.

:class:`ProgramSkips` reads the counters of one loaded program set and returns their growth; the
receiver counts it in ``otel_ebpf.bpf.runs_skipped{receiver,program}`` (docs/receivers.md). Not as a
drop: the kernel does not say whose event a skipped run was, and a program that filters by the
traced set (every one here) would have ignored most of them (a wakeup of the agent's own thread).
"""
from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ProgramSkips", "recursion_misses"]

_FIELD = "recursion_misses:"


def recursion_misses(fd: int) -> int | None:
    """The kernel's count of skipped runs of the BPF program behind ``fd`` (of this process); None
    when the kernel does not say (an older kernel, or not a program fd)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(_FIELD):
                    return int(line[len(_FIELD):].strip())
    except (OSError, ValueError):
        return None
    return None


class ProgramSkips:
    """The growth of each program's ``recursion_misses`` since the last :meth:`read`; a program
    first seen counts from 0 (loaded by this receiver: nothing skipped before it)."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def read(self, programs: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """(program name, runs skipped since the last read) of each of ``programs`` ((name, fd)) that grew."""
        grown: list[tuple[str, int]] = []
        for name, fd in programs:
            n = recursion_misses(fd)
            if n is None:
                continue
            before = self._seen.get(name, 0)
            if n > before:
                grown.append((name, n - before))
            self._seen[name] = max(n, before)
        return grown
