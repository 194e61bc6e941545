"""Small readers of ``/proc/PID/stat`` that receivers share: is a process gone, its parent, its
page-fault count.

Contract shared by every function here: one ``open`` + ``read`` of ``/proc/PID/stat`` per call
(no caching, so the answer is as fresh as the call), never raises for a process that exited or a
malformed line, and never blocks beyond that read. The fields after the command name are found
from the LAST ``)`` of the line, because the command name (field 2) may itself hold spaces and
parentheses (proc(5)). Thread-safe (no shared state).

States that count as gone: ``Z`` (a zombie: it has exited, only its exit status waits to be
reaped) and ``X`` (dead), and a ``/proc`` entry that is missing or unreadable. A receiver reads a
gone process's counters one last time and then deletes them (see :mod:`otel_ebpf.bpf.maps`).
"""
from __future__ import annotations

__all__ = ["GONE_STATES", "fault_count", "parent_pid", "process_gone", "stat_fields"]

GONE_STATES = (b"Z", b"X")  # proc(5) field 3: zombie, dead


def stat_fields(pid: int, proc_root: str = "/proc") -> list[bytes] | None:
    """The whitespace-separated fields of ``<proc_root>/PID/stat`` after the command name, field 3
    (the state letter) first, so proc(5) field ``n`` is ``fields[n - 3]``; None when the file
    cannot be read (the process is gone, or ``pid`` is not a process id)."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except (OSError, ValueError):
        return None
    return stat[stat.rfind(b")") + 2:].split()


def process_gone(pid: int, proc_root: str = "/proc") -> bool:
    """True when ``pid`` has exited: no readable ``/proc`` entry, a zombie waiting to be reaped
    (``Z``), dead (``X``), or a stat line with no state."""
    fields = stat_fields(pid, proc_root)
    return not fields or fields[0][:1] in GONE_STATES


def parent_pid(pid: int, proc_root: str = "/proc") -> int | None:
    """The parent's pid (proc(5) field 4), None when ``pid`` is gone or the line is malformed. A
    zombie still has its parent until it is reaped."""
    fields = stat_fields(pid, proc_root)
    try:
        return int(fields[1]) if fields is not None else None
    except (ValueError, IndexError):
        return None


def fault_count(pid: int, proc_root: str = "/proc") -> int | None:
    """Page faults of ``pid`` so far, minor + major (proc(5) fields 10 and 12; its threads', not
    its reaped children's), None when it is gone (see :func:`process_gone`) or the line is malformed."""
    fields = stat_fields(pid, proc_root)
    if not fields or fields[0][:1] in GONE_STATES:
        return None
    try:
        return int(fields[7]) + int(fields[9])
    except (ValueError, IndexError):
        return None
