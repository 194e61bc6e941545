"""The block IO receiver: tracepoints on block requests (blockio.bpf.c), aggregated in the
kernel, read every ``interval`` as :class:`DiskIoStats` / :class:`ProcessDiskIo` deltas.

No record crosses the ring buffer per IO (only the shared process lifecycle records do).
Counters of processes that are gone are read one last time and deleted; everything is read once
more at shutdown. When the context has a host-stats store (``ctx.host_stats``), each traced
process's cumulative IO time and bytes are handed to it at every read.

Threading: ``poll_maps`` runs on the receiver's poll thread only and never raises (a failed map
read is counted as ``otel_ebpf.events.dropped{reason=map_read_error}``).
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from otel_ebpf.bpf.maps import MapDeltas
from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.core.pipeline import Consumer, Context

from .config import Config
from .events import DiskIoStats, ProcessDiskIo

__all__ = ["MISC_REASONS", "OPS", "SLOTS", "UNTIMED_FLUSHES", "BlockIoReceiver", "device_name"]

log = logging.getLogger(__name__)
SLOTS = 32  # BLK_SLOTS in blockio.h (checked by tests/unit/test_blockio_layout.py)
OPS = ("read", "write", "discard", "flush", "other")  # index = BLK_OP_*
# blk_misc[] index -> otel_ebpf.events.dropped reason (BLK_MISC_*)
MISC_REASONS = ("no_issue_seen", "stats_map_full", "process_map_full", "state_map_full")
UNTIMED_FLUSHES = "otel_ebpf.blockio.untimed_flushes"  # blk_misc[BLK_MISC_FLUSH]: not a drop, see blockio.bpf.c
_MAX_DEVICE_NAMES = 4096
_MAX_TOTALS = 65536
DevKey = tuple[int, int]  # (dev, op)
ProcKey = tuple[int, int, int]  # (tgid, dev, op)


def device_name(dev: int, sys_root: str = "/sys") -> str:
    """The kernel's name of block device ``dev`` (kernel dev_t: major << 20 | minor), from
    /sys/dev/block/MAJ:MIN/uevent (DEVNAME=), or "MAJ:MIN" when it is not there."""
    major, minor = dev >> 20, dev & 0xFFFFF
    try:
        with open(f"{sys_root}/dev/block/{major}:{minor}/uevent") as fh:
            for line in fh:
                if line.startswith("DEVNAME="):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return f"{major}:{minor}"


class BlockIoReceiver(BpfReceiver):
    """Receiver ``blockio``: per-device latency histograms (every process) and per-process
    bytes/latency (the traced processes of ``ctx.target_pids``, or every process without)."""

    name = "blockio"
    src_file = Path(__file__).with_name("blockio.bpf.c")

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(ctx, next_, ringbuf_pages=8, poll_interval=min(config.interval, 0.1))
        self.config = config
        self._names: OrderedDict[int, str] = OrderedDict()
        self._dev: MapDeltas[DevKey] = MapDeltas(lambda k: (k.dev, k.op), _dev_total)
        self._proc: MapDeltas[ProcKey] = MapDeltas(lambda k: (k.tgid, k.dev, k.op), _proc_total,
                                                   max_keys=_MAX_TOTALS)
        self._misc_seen = [0] * (len(MISC_REASONS) + 1)
        self._next_read = 0.0
        self._final_read = False

    def cflags(self) -> list[str]:
        c = self.config
        return [f"-DBLK_MAX_INFLIGHT={c.max_inflight}", f"-DBLK_MAX_DEV_KEYS={c.max_devices}",
                f"-DBLK_MAX_PROC_KEYS={c.max_process_keys}"]

    def device(self, dev: int) -> str:
        name = self._names.get(dev)
        if name is None:
            name = self._names[dev] = device_name(dev)
            if len(self._names) > _MAX_DEVICE_NAMES:
                self._names.popitem(last=False)
        return name

    def poll_maps(self) -> list[object]:
        now = time.monotonic()
        if not self._final_read and now < self._next_read:
            return []
        self._next_read = now + self.config.interval
        try:
            out: list[object] = list(self.read_device_stats())
            out.extend(self.read_process_stats())
            self._read_misc()
            return out
        except Exception:  # a map read must not stop the poll loop
            log.debug("%s: reading maps failed", self.name, exc_info=True)
            self.ctx.telemetry.dropped(self.name, "map_read_error")
            return []

    def read_device_stats(self) -> list[DiskIoStats]:
        """Deltas of every (device, op) histogram since the last read."""
        if self.bpf is None:
            return []
        now_ns = time.time_ns()
        out = []
        for (dev, op), d in self._dev.moved(self.bpf["blk_dev_stats"], gone=_never_gone):
            buckets = tuple((i, n) for i, n in enumerate(d[3:]) if n > 0)
            out.append(DiskIoStats(self.device(dev), _op(op), d[0], d[1], d[2], buckets, now_ns))
        return out

    def read_process_stats(self) -> list[ProcessDiskIo]:
        """Deltas per (traced process, device, op); counters of processes that are gone are
        deleted after this (final) read. Hands cumulative per-process totals to host_stats."""
        if self.bpf is None:
            return []
        now_ns = time.time_ns()
        out = []
        cumulative: dict[int, list[int]] = {}
        for row in self._proc.read(self.bpf["blk_proc_stats"]):
            tgid, dev, op = row.key
            if row.moved:
                ops, nbytes, ns = row.delta
                out.append(ProcessDiskIo(tgid, self.device(dev), _op(op), ops, nbytes, ns, now_ns))
            total = cumulative.setdefault(tgid, [0, 0])
            total[0] += row.total[2]
            total[1] += row.total[1]
            if not row.kept:
                self.ctx.telemetry.dropped(self.name, "totals_table_full")
        self._to_host_stats(cumulative, now_ns)
        return out

    def _to_host_stats(self, cumulative: dict[int, list[int]], now_ns: int) -> None:
        store = getattr(self.ctx, "host_stats", None)
        if store is None:
            return
        for pid, (ns, nbytes) in cumulative.items():
            try:
                store.add(pid, now_ns, io_ns=ns, io_bytes=nbytes)
            except Exception:
                log.debug("%s: host_stats.add failed", self.name, exc_info=True)
                self.ctx.telemetry.dropped(self.name, "host_stats_error")

    def _read_misc(self) -> None:
        if self.bpf is None:
            return
        names = (*MISC_REASONS, UNTIMED_FLUSHES)
        for name, n in self._array_deltas("blk_misc", names, self._misc_seen):
            if name == UNTIMED_FLUSHES:
                self.ctx.telemetry.add(UNTIMED_FLUSHES, n, receiver=self.name)
            else:
                self.ctx.telemetry.dropped(self.name, name, n)

    def shutdown(self) -> None:
        self._final_read = True  # the base's last drain reads the counters one more time
        super().shutdown()


def _op(index: int) -> str:
    return OPS[index] if 0 <= index < len(OPS) else "other"


def _never_gone(_pid: int) -> bool:
    return False  # device keys hold no process


def _dev_total(per_cpu: Any) -> tuple[int, ...]:
    """(ops, bytes, ns, slot 0 .. slot SLOTS-1) summed over the CPUs."""
    return (sum(v.ops for v in per_cpu), sum(v.bytes for v in per_cpu), sum(v.ns for v in per_cpu),
            *(sum(v.slots[i] for v in per_cpu) for i in range(SLOTS)))


def _proc_total(per_cpu: Any) -> tuple[int, ...]:
    """(ops, bytes, ns) summed over the CPUs."""
    return sum(v.ops for v in per_cpu), sum(v.bytes for v in per_cpu), sum(v.ns for v in per_cpu)
