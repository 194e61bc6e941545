"""Typed events of the lifecycle receiver: one frozen dataclass per kind.

Times are Unix epoch nanoseconds. ``argv`` is exactly what the caller passed to execve, read in
the kernel: it is not redacted here (the ``lifecycle`` processor redacts it before anything is
exported).
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = ["LifecycleExec", "LifecycleExitCode", "LifecycleFork"]


@fast_init
@dataclass(frozen=True, slots=True)
class LifecycleFork:
    """Traced process ``ppid`` created process ``pid`` (``comm``: the parent's name)."""

    pid: int
    ppid: int
    time_ns: int
    comm: str


@fast_init
@dataclass(frozen=True, slots=True)
class LifecycleExec:
    """Process ``pid`` (thread ``tid``) successfully exec'd ``filename`` (execve or execveat) with
    ``argv`` as the caller passed it, read in the kernel. ``truncated``: more or longer arguments
    than kept."""

    pid: int
    tid: int
    time_ns: int
    filename: str
    argv: tuple[str, ...]
    truncated: bool


@fast_init
@dataclass(frozen=True, slots=True)
class LifecycleExitCode:
    """Process ``pid`` called exit_group(``exit_code``) (the low 8 bits, as its parent sees)."""

    pid: int
    time_ns: int
    exit_code: int
