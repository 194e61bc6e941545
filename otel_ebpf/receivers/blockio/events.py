"""Typed events of the block IO receiver: one frozen dataclass per kind.

Both are deltas since the previous read of the in-kernel maps (``time_ns``, epoch ns, is when
they were read). ``op`` is ``read``, ``write``, ``discard``, ``flush`` or ``other`` (from the
tracepoint's rwbs). ``device`` is the kernel's name (``vda``, ``nvme0n1``) from
/sys/dev/block/MAJ:MIN/uevent, or ``MAJ:MIN`` when it has none. Latency is block_rq_issue to
block_rq_complete: time at the device, without the time queued in the IO scheduler.
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = ["DiskIoStats", "ProcessDiskIo"]


@fast_init
@dataclass(frozen=True, slots=True)
class DiskIoStats:
    """Completed requests of one (device, op). ``buckets``: (slot, count) pairs of the log2
    latency histogram, slot s holding latencies in [2^(s-1), 2^s) microseconds (slot 0: < 1us)."""

    device: str
    op: str
    ops: int
    bytes: int
    ns: int
    buckets: tuple[tuple[int, int], ...]
    time_ns: int


@fast_init
@dataclass(frozen=True, slots=True)
class ProcessDiskIo:
    """Completed requests of one (traced process, device, op): those it submitted (the request was
    allocated in its context, wherever it was later inserted or issued)."""

    pid: int
    device: str
    op: str
    ops: int
    bytes: int
    ns: int
    time_ns: int
