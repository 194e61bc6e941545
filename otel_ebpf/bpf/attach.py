"""Attach-once bookkeeping for receivers that attach probes to libraries as processes map them.

A library is found again by every process that maps it and by every rescan, and a receiver's
``attach_library`` may be called from its poll thread and from ``start``: the probes of one
library (by real path, so symlinks and ``/proc/PID/root`` aliases count once) must be attached
once per loaded program. A path that is no regular file is never claimed: the kernel reports only
successful opens (common.bpf.c), but a path from a map or a config may name a directory or a file
gone since.
"""
from __future__ import annotations

import os

__all__ = ["claim_library"]


def claim_library(attached: set[str], path: str, loaded: bool) -> str | None:
    """The real path of ``path`` when its probes are to be attached now, having recorded it in
    ``attached``; None when it already is there, is no regular file (a loader's failed candidate), or
    ``loaded`` is False (no program to attach).

    Not thread-safe by itself: call it with the receiver's attach lock held (the one that guards
    ``attached``), and keep holding it while attaching when the attach itself is not thread-safe."""
    real = os.path.realpath(path)
    if real in attached or not loaded or not os.path.isfile(real):
        return None
    attached.add(real)
    return real
