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

from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.core.pipeline import Consumer, Context

from .config import Config
from .events import DiskIoStats, ProcessDiskIo

__all__ = ["MISC_REASONS", "OPS", "SLOTS", "UNTIMED_FLUSHES", "BlockIoReceiver", "device_name", "process_gone"]

log = logging.getLogger(__name__)
SLOTS = 32  # BLK_SLOTS in blockio.h (checked by tests/unit/test_blockio_layout.py)
OPS = ("read", "write", "discard", "flush", "other")  # index = BLK_OP_*
# blk_misc[] index -> otel_ebpf.events.dropped reason (BLK_MISC_*)
MISC_REASONS = ("no_issue_seen", "stats_map_full", "process_map_full", "state_map_full")
UNTIMED_FLUSHES = "otel_ebpf.blockio.untimed_flushes"  # blk_misc[BLK_MISC_FLUSH]: not a drop, see blockio.bpf.c
_MAX_DEVICE_NAMES = 4096
_MAX_TOTALS = 65536


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


def process_gone(pid: int) -> bool:
    """True when ``pid`` has exited (no /proc entry, or a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] in (b"Z", b"X", b"")


class BlockIoReceiver(BpfReceiver):
    """Receiver ``blockio``: per-device latency histograms (every process) and per-process
    bytes/latency (the traced processes of ``ctx.target_pids``, or every process without)."""

    name = "blockio"
    src_file = Path(__file__).with_name("blockio.bpf.c")

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(ctx, next_, ringbuf_pages=8, poll_interval=min(config.interval, 0.1))
        self.config = config
        self._names: OrderedDict[int, str] = OrderedDict()
        self._dev_totals: dict[tuple[int, int], tuple[int, int, int, tuple[int, ...]]] = {}
        self._proc_totals: dict[tuple[int, int, int], tuple[int, int, int]] = {}
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
        for key, per_cpu in self.bpf["blk_dev_stats"].items():
            k = (key.dev, key.op)
            ops = sum(v.ops for v in per_cpu)
            nbytes = sum(v.bytes for v in per_cpu)
            ns = sum(v.ns for v in per_cpu)
            slots = tuple(sum(v.slots[i] for v in per_cpu) for i in range(SLOTS))
            old = self._dev_totals.get(k, (0, 0, 0, (0,) * SLOTS))
            self._dev_totals[k] = (ops, nbytes, ns, slots)
            if ops <= old[0]:
                continue
            buckets = tuple((i, n - o) for i, (n, o) in enumerate(zip(slots, old[3], strict=True)) if n > o)
            out.append(DiskIoStats(self.device(key.dev), _op(key.op), ops - old[0], nbytes - old[1],
                                   ns - old[2], buckets, now_ns))
        return out

    def read_process_stats(self) -> list[ProcessDiskIo]:
        """Deltas per (traced process, device, op); counters of processes that are gone are
        deleted after this (final) read. Hands cumulative per-process totals to host_stats."""
        if self.bpf is None:
            return []
        table = self.bpf["blk_proc_stats"]
        now_ns = time.time_ns()
        out = []
        gone: dict[int, bool] = {}
        cumulative: dict[int, list[int]] = {}
        for key, per_cpu in table.items():
            k = (key.tgid, key.dev, key.op)
            ops, nbytes, ns = (sum(v.ops for v in per_cpu), sum(v.bytes for v in per_cpu),
                               sum(v.ns for v in per_cpu))
            old = self._proc_totals.get(k, (0, 0, 0))
            if ops > old[0]:
                out.append(ProcessDiskIo(key.tgid, self.device(key.dev), _op(key.op), ops - old[0],
                                         nbytes - old[1], ns - old[2], now_ns))
            total = cumulative.setdefault(key.tgid, [0, 0])
            total[0] += ns
            total[1] += nbytes
            if key.tgid not in gone:
                gone[key.tgid] = process_gone(key.tgid)
            if gone[key.tgid]:
                try:
                    del table[key]
                except KeyError:
                    pass
                self._proc_totals.pop(k, None)
            elif len(self._proc_totals) < _MAX_TOTALS or k in self._proc_totals:
                self._proc_totals[k] = (ops, nbytes, ns)
            else:
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
        misc = self.bpf["blk_misc"]
        for i, reason in enumerate(MISC_REASONS):
            total = misc[misc.Key(i)].value
            if total > self._misc_seen[i]:
                self.ctx.telemetry.dropped(self.name, reason, total - self._misc_seen[i])
                self._misc_seen[i] = total
        flushes = misc[misc.Key(len(MISC_REASONS))].value
        if flushes > self._misc_seen[-1]:
            self.ctx.telemetry.add(UNTIMED_FLUSHES, flushes - self._misc_seen[-1], receiver=self.name)
            self._misc_seen[-1] = flushes

    def shutdown(self) -> None:
        self._final_read = True  # the base's last drain reads the counters one more time
        super().shutdown()


def _op(index: int) -> str:
    return OPS[index] if 0 <= index < len(OPS) else "other"
