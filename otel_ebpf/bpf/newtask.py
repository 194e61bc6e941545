"""The ``task:task_newtask`` tracepoint, shared by the receivers that see new tasks (``lifecycle``: forks;
``sched``: a new thread's first run-queue wait).

Its record's layout is the running kernel's, not the headers' (BCC compiles against Debian's 6.1 headers on
a 6.18 kernel here), so the offsets of ``pid`` and ``clone_flags`` are read from the tracepoint's format file
and passed to the program as ``-D`` macros. Receivers are independent of each other (pyproject's import
contracts), so this lives in the BPF runtime layer below them.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from otel_ebpf.core.errors import AttachError

__all__ = ["NEWTASK", "USUAL_OFFSETS", "attach_newtask", "compile_offsets", "newtask_offsets"]

log = logging.getLogger(__name__)

NEWTASK = "task:task_newtask"
USUAL_OFFSETS = (8, 32)  # pid and clone_flags on x86-64 6.x: only for --dump-bpf on a host without tracefs
_TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


def newtask_offsets() -> tuple[int, int]:
    """(pid offset, clone_flags offset) in task:task_newtask's record, from its format file. Raises
    AttachError naming the tracefs paths when it is not found."""
    for base in _TRACEFS:
        try:
            text = Path(f"{base}/events/task/task_newtask/format").read_text()
        except OSError:
            continue
        found = dict(re.findall(r"field:[^;]*?\b(pid|clone_flags);\s*offset:(\d+);", text))
        if "pid" in found and "clone_flags" in found:
            return int(found["pid"]), int(found["clone_flags"])
    raise AttachError("tracefs", NEWTASK, "its format file (pid, clone_flags offsets) was not found "
                      f"under {' or '.join(_TRACEFS)}")


def compile_offsets(known: tuple[int, int] | None) -> tuple[int, int]:
    """The offsets to compile with: ``known`` (read at start), else the running kernel's, else
    :data:`USUAL_OFFSETS` (``--dump-bpf`` on a host without tracefs; ``start`` reads them for real)."""
    if known is not None:
        return known
    try:
        return newtask_offsets()
    except AttachError as exc:
        log.debug("%s", exc)
        return USUAL_OFFSETS


def attach_newtask(receiver: Any, fn_name: str, *, lost: str) -> None:
    """Attach ``fn_name`` of ``receiver``'s loaded program (a started BpfReceiver) to task:task_newtask. A
    failure is one warning saying what the receiver then misses (``lost``); with ``ctx.strict`` the
    receiver is shut down and AttachError raised."""
    try:
        receiver.bpf.attach_tracepoint(tp=NEWTASK, fn_name=fn_name)
    except Exception as exc:
        err = AttachError("tracepoint", NEWTASK, str(exc).strip() or type(exc).__name__)
        if receiver.ctx.strict:
            receiver.shutdown()
            raise err from None
        log.warning("%s: %s: %s", receiver.name, err, lost)
