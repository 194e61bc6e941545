"""Typed events of the Python receiver.

Times are Unix epoch nanoseconds. ``start_ns`` of a call is also its id within its thread:
``parent_start`` / ``root_start`` name the nearest enclosing and the outermost recorded call
(by their ``start_ns``; 0 when there is none), so spans can be nested without waiting for the
parent (which returns, and is recorded, after its children).
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = ["PythonCall"]


@fast_init
@dataclass(frozen=True, slots=True)
class PythonCall:
    """One Python function call that passed the in-kernel filters (min duration, path prefix).

    ``file`` and ``function`` are ``co_filename`` and ``co_name`` (cut to 127 / 63 bytes);
    ``line`` is the line number at entry; ``depth`` counts the frames below it on the thread's
    stack since the probes attached."""

    pid: int
    tid: int
    function: str
    file: str
    line: int
    depth: int
    start_ns: int
    end_ns: int
    parent_start: int
    root_start: int
