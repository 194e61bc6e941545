"""A process's command line and program as resource attributes, from ``/proc`` or from the kernel.

One function for both sources, so a command line read from ``/proc/PID/cmdline`` and one the
kernel read at exec (:meth:`otel_ebpf.host.processes.ResourceCache.hint`) are redacted and capped
alike: secrets replaced (:func:`otel_ebpf.host.redact.redact_command_line`) before anything is
cut, ``process.command_line`` at :data:`MAX_COMMAND_LINE_CHARS` characters,
``process.command_args`` at 256 per argument and 4096 in all. Arguments must already be cleaned of
control characters (:func:`otel_ebpf.host.attributes.clean`), so a hidden one cannot split a key.
Pure functions; never raise for str input.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.semconv._incubating.attributes import process_attributes as _proc

from otel_ebpf.host.attributes import MAX_VALUE_CHARS, Attributes, clean
from otel_ebpf.host.redact import redact_command_line

__all__ = ["MAX_CMDLINE_READ", "MAX_COMMAND_LINE_CHARS", "command_attributes", "exec_attributes"]

MAX_COMMAND_LINE_CHARS = 4096
MAX_CMDLINE_READ = 128 * 1024  # bytes of /proc/PID/cmdline read; longest argument cleaned


def command_attributes(argv: Sequence[str], redact: Sequence[str]) -> Attributes:
    """``process.command_line`` and ``process.command_args`` of cleaned ``argv``; {} when empty."""
    if not argv:
        return {}
    redacted = redact_command_line(argv, redact)  # redact first, cap after
    kept: list[str] = []
    total = 0
    for arg in redacted:
        total += min(len(arg), MAX_VALUE_CHARS)
        if total > MAX_COMMAND_LINE_CHARS:
            break
        kept.append(arg[:MAX_VALUE_CHARS])
    line = " ".join(redacted)[:MAX_COMMAND_LINE_CHARS]
    return {_proc.PROCESS_COMMAND_LINE: line, _proc.PROCESS_COMMAND_ARGS: tuple(kept)}


def exec_attributes(filename: str, argv: Sequence[str], redact: Sequence[str]) -> Attributes:
    """The program attributes of an exec the kernel reported: ``filename`` as passed to execve (the
    path only when absolute: an execveat one is relative to its dirfd), ``argv`` raw (cleaned here)."""
    attrs = command_attributes([clean(a, MAX_CMDLINE_READ) for a in argv], redact)
    path = clean(filename, MAX_CMDLINE_READ)
    if path.startswith("/"):
        attrs[_proc.PROCESS_EXECUTABLE_PATH] = path[:MAX_VALUE_CHARS]
    if os.path.basename(path):
        attrs[_proc.PROCESS_EXECUTABLE_NAME] = os.path.basename(path)[:MAX_VALUE_CHARS]
    return attrs
