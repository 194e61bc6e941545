"""The ``cuda.kernel.name`` of launch metrics, bounded: at most ``limit`` names per process, the rest ``other``.

A process's kernels are admitted in the order of their launch counts within the stats read in which each was
first seen (the receiver hands a read's counters over largest first), and an admitted name keeps its own series
for the life of the process: series never move between a name and ``other``. So the first ``limit`` names are the
busiest of the first reads, which in a training or serving loop are its steady kernels. Single-threaded (the
processor's).
"""
from __future__ import annotations

__all__ = ["OTHER", "KernelLabels"]

OTHER = "other"


class KernelLabels:
    """Per process: the kernel names that have their own series."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._admitted: dict[int, set[str]] = {}

    def label(self, pid: int, name: str) -> str:
        """``name`` when it has (or now gets) a series of its own in ``pid``, else :data:`OTHER`."""
        admitted = self._admitted.setdefault(pid, set())
        if name in admitted:
            return name
        if len(admitted) < self.limit:
            admitted.add(name)
            return name
        return OTHER

    def forget(self, pid: int) -> None:
        self._admitted.pop(pid, None)
