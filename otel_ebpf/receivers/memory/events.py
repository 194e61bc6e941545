"""Typed events of the memory receiver: one frozen dataclass per kind. Times are epoch ns."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = ["MemoryUsage", "OomKill", "PageFaults"]


@fast_init
@dataclass(frozen=True, slots=True)
class PageFaults:
    """``count`` more user page faults (minor and major) of process ``pid`` since the last read."""

    pid: int
    count: int
    time_ns: int


@fast_init
@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """Process ``pid``'s resident (``rss``) and virtual (``virtual``) size in bytes, read from
    /proc/PID/statm at ``time_ns``."""

    pid: int
    rss: int
    virtual: int
    time_ns: int


@fast_init
@dataclass(frozen=True, slots=True)
class OomKill:
    """The kernel's OOM killer chose process ``pid`` (oom:mark_victim). Sizes in bytes at that
    moment (0 where the kernel's tracepoint has only the pid). ``trigger_pid``: the process
    whose allocation failed (itself, or another one in the same memory cgroup)."""

    pid: int
    comm: str
    time_ns: int
    total_vm: int
    anon_rss: int
    file_rss: int
    shmem_rss: int
    uid: int
    oom_score_adj: int
    trigger_pid: int
