"""The memory receiver: page faults (counted in the kernel), RSS (sampled from /proc), OOM kills
(one ring-buffer record each) of the traced processes; see memory.bpf.c.

Every ``interval`` :meth:`MemoryReceiver.poll_maps` turns the per-process fault counters into
:class:`PageFaults` deltas and reads /proc/PID/statm of each process with a counter into a
:class:`MemoryUsage`; counters of processes that are gone are read one last time and deleted.
When the context has a host-stats store (``ctx.host_stats``), each process's cumulative fault
count is handed to it at every read. Where the kernel has no exceptions:page_fault_user
tracepoint (non-x86), fault counts come from /proc/PID/stat (minflt + majflt) of the live
traced processes instead (with target processes only), which misses processes shorter than
one interval.

Threading: ``decode`` and ``poll_maps`` run on the receiver's poll thread only and never raise.
"""
from __future__ import annotations

import logging
import os
import struct
import time
from pathlib import Path

from otel_ebpf.bpf.maps import MapDeltas
from otel_ebpf.bpf.receiver import BpfReceiver
from otel_ebpf.bpf.records import Mirror
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.host.procfs import fault_count

from .config import Config
from .events import MemoryUsage, OomKill, PageFaults

__all__ = ["FAULT_TRACEPOINT", "OOM", "MemoryReceiver", "read_statm"]

log = logging.getLogger(__name__)
TRACEFS = "/sys/kernel/tracing/events"
FAULT_TRACEPOINT = f"{TRACEFS}/exceptions/page_fault_user"
OOM_FORMAT = f"{TRACEFS}/oom/mark_victim/format"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


OOM = Mirror("mm_oom_rec", 80, struct.Struct("<B3xIQQQQQIiI4x16s"),
             ("type", "pid", "ts", "total_vm_kb", "anon_rss_kb", "file_rss_kb", "shmem_rss_kb", "uid",
              "oom_score_adj", "trigger_tgid", "comm"))


def read_statm(pid: int, proc_root: str = "/proc") -> tuple[int, int] | None:
    """(rss, virtual) in bytes from /proc/PID/statm, or None when the process is gone."""
    try:
        with open(f"{proc_root}/{pid}/statm", "rb") as fh:
            size, resident = fh.read().split()[:2]
        return int(resident) * PAGE_SIZE, int(size) * PAGE_SIZE
    except (OSError, ValueError):
        return None


class MemoryReceiver(BpfReceiver):
    """Receiver ``memory`` (see the module docstring)."""

    name = "memory"
    src_file = Path(__file__).with_name("memory.bpf.c")

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(ctx, next_, ringbuf_pages=config.ringbuf_pages,
                         poll_interval=min(config.interval, 0.1))
        self.config = config
        self.fault_tracepoint = config.fault_source == "tracepoint" and os.path.isdir(FAULT_TRACEPOINT)
        # pid -> (faults,): the tracepoint counters (mm_faults, per CPU) or /proc/PID/stat
        self._faults: MapDeltas[int] = MapDeltas(lambda key: key.value, lambda per_cpu: (sum(per_cpu),))
        self._next_read = 0.0
        self._final_read = False

    def cflags(self) -> list[str]:
        try:
            detail = "anon_rss" in Path(OOM_FORMAT).read_text()
        except OSError:
            detail = False
        return [f"-DMM_MAX_PIDS={self.config.max_processes}",
                f"-DMM_FAULT_TP={1 if self.fault_tracepoint else 0}", f"-DMM_OOM_DETAIL={1 if detail else 0}"]

    def start(self) -> None:
        if self.config.fault_source == "tracepoint" and not self.fault_tracepoint and self.bpf is None:
            log.warning("%s: fault_source 'tracepoint' asked, but there is no exceptions:page_fault_user "
                        "tracepoint here (it is x86-only); page faults come from /proc/PID/stat of live "
                        "traced processes", self.name)
        super().start()

    # ---- ring-buffer records ----------------------------------------------------------
    def decode(self, etype: int, raw: bytes) -> object | None:
        if etype != OOM.etype:
            raise ValueError(f"unknown memory record type {etype}")
        (_, pid, ts, total_vm, anon, file_, shmem, uid, adj, trigger,
         comm_b) = OOM.fmt.unpack_from(raw)
        comm = comm_b.split(b"\0", 1)[0].decode(errors="replace")
        if not comm and self.ctx.resources is not None:
            comm = str(self.ctx.resources.get(pid).get("process.executable.name", ""))
        return OomKill(pid, comm, self.clock.to_epoch_ns(ts), total_vm * 1024, anon * 1024, file_ * 1024,
                       shmem * 1024, uid, adj, trigger)

    # ---- counters and /proc -----------------------------------------------------------
    def poll_maps(self) -> list[object]:
        now = time.monotonic()
        if not self._final_read and now < self._next_read:
            return []
        self._next_read = now + self.config.interval
        try:
            if self.fault_tracepoint:
                return self.read_counters()
            return [*self._faults_from_proc(), *self._usage(self._faults.totals.keys())]
        except Exception:  # a map read must not stop the poll loop
            log.debug("%s: reading maps failed", self.name, exc_info=True)
            self.ctx.telemetry.dropped(self.name, "map_read_error")
            return []

    def read_counters(self) -> list[object]:
        """Fault deltas per process since the last read, and each one's RSS now (one statm read
        per process); counters of gone processes are deleted after this (final) read."""
        if self.bpf is None:
            return []
        now_ns = time.time_ns()
        statm: dict[int, tuple[int, int] | None] = {}

        def reaped(pid: int) -> bool:  # one statm read per process: gone, and its RSS
            statm[pid] = read_statm(pid)  # a zombie still has one (all zeros): it is not gone yet
            return statm[pid] is None

        out: list[object] = []
        for row in self._faults.read(self.bpf["mm_faults"], reaped):
            pid = row.key
            if row.moved:
                out.append(PageFaults(pid, row.delta[0], now_ns))
            self._to_host_stats(pid, row.total[0], now_ns)
            usage = statm[pid]
            if usage is not None and usage[1] > 0:  # a zombie reads as all zeros
                out.append(MemoryUsage(pid, usage[0], usage[1], now_ns))
        return out

    def _faults_from_proc(self) -> list[PageFaults]:
        if self.bpf is None:
            return []
        now_ns = time.time_ns()
        totals = self._faults.totals
        pids = [k.value for k in self.bpf["traced"].keys()] if self.ctx.target_pids else totals.keys()
        out = []
        for pid in pids[: self.config.max_processes]:
            total = fault_count(pid)
            if total is None:
                totals.forget(pid)
                continue
            delta = totals.update(pid, (total,))[0][0]
            if delta > 0:
                out.append(PageFaults(pid, delta, now_ns))
            self._to_host_stats(pid, total, now_ns)
        return out

    def _usage(self, pids: list[int]) -> list[object]:
        now_ns = time.time_ns()
        out: list[object] = []
        for pid in pids:
            statm = read_statm(pid)
            if statm is not None and statm[1] > 0:  # a zombie reads as all zeros
                out.append(MemoryUsage(pid, statm[0], statm[1], now_ns))
        return out

    def _to_host_stats(self, pid: int, faults: int, now_ns: int) -> None:
        store = getattr(self.ctx, "host_stats", None)
        if store is None:
            return
        try:
            store.add(pid, now_ns, page_faults=faults)
        except Exception:
            log.debug("%s: host_stats.add failed", self.name, exc_info=True)
            self.ctx.telemetry.dropped(self.name, "host_stats_error")

    def shutdown(self) -> None:
        self._final_read = True  # the base's last drain reads the counters one more time
        super().shutdown()
