"""Memory events (otel_ebpf/receivers/memory) -> MetricRecord / SpanRecord; everything else passes unchanged.

Metrics (scope ``otel_ebpf.bpf.compiler_memory``, on the traced process's resource; semconv names):

* ``process.paging.faults`` counter {fault}: user page faults, minor and major together (the
  tracepoint fires before the kernel knows which, so no ``process.paging.fault_type``).
* ``process.memory.usage`` updown By: resident set size (RSS).
* ``process.memory.virtual`` updown By: virtual size. Both are sampled every receiver interval
  and emitted as deltas, so their sum is the last reading; at the process's exit they return to 0.
* ``process.oom_kills`` counter {kill}: times the OOM killer chose the process (otel-ebpf's name).

Span ``process.oom_kill`` (zero length, at the kill, status ERROR ``oom_kill``) on the victim's
resource, one per OOM kill, with ``process.pid``, ``process.executable.name`` (the victim's
comm), ``process.oom.total_vm``, ``process.oom.anon_rss``, ``process.oom.file_rss``,
``process.oom.shmem_rss`` (bytes), ``process.oom.score_adj``, ``process.oom.trigger_pid``
(the process whose allocation failed) and ``user.id``. It is also logged as a warning.

Threading: single-threaded (the pipeline worker calls ``consume``); ``consume`` never raises.
"""
from __future__ import annotations

import logging
from collections import OrderedDict

from otel_ebpf.core.events import Attributes, ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles

from ...receivers.memory.events import MemoryUsage, OomKill, PageFaults
from .config import Config

__all__ = ["METRICS", "SCOPE", "MemoryProcessor"]

log = logging.getLogger(__name__)
SCOPE = "otel_ebpf.bpf.compiler_memory"
METRICS: dict[str, MetricSpec] = {
    "process.paging.faults": ("counter", "{fault}", "Number of page faults the process has made."),
    "process.memory.usage": ("updown", "By", "The amount of physical memory in use (RSS)."),
    "process.memory.virtual": ("updown", "By", "The amount of committed virtual memory."),
    "process.oom_kills": ("counter", "{kill}", "Times the kernel's OOM killer chose the process."),
}


class MemoryProcessor(EventProcessor[Config]):
    """Processor ``memory``. Keeps the last RSS/virtual reading per process (bounded)."""

    NAME = "memory"
    SCOPE = SCOPE
    METRICS = METRICS

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(config, ctx, next_)
        self._last: OrderedDict[int, tuple[int, int]] = OrderedDict()

    @handles(PageFaults)
    def _faults(self, ev: PageFaults, out: list[object]) -> None:
        self.metric(out, ev.pid, "process.paging.faults", ev.count)

    @handles(MemoryUsage)
    def _reading(self, ev: MemoryUsage, out: list[object]) -> None:
        self._usage(ev.pid, ev.rss, ev.virtual, out)

    @handles(ProcessExit)
    def _exit(self, ev: ProcessExit, out: list[object]) -> None:
        """At the process's exit (seen by this receiver) its usage returns to 0; the exit passes on."""
        if ev.source == "memory" and ev.pid in self._last:
            self._usage(ev.pid, 0, 0, out)
            del self._last[ev.pid]
        out.append(ev)

    def _usage(self, pid: int, rss: int, virtual: int, out: list[object]) -> None:
        old_rss, old_virtual = self._last.pop(pid, (0, 0))
        if rss != old_rss:
            self.metric(out, pid, "process.memory.usage", rss - old_rss)
        if virtual != old_virtual:
            self.metric(out, pid, "process.memory.virtual", virtual - old_virtual)
        self._last[pid] = (rss, virtual)
        if len(self._last) > self.config.max_processes:
            self._last.popitem(last=False)
            self._telemetry.dropped(self.NAME, "usage_table_full")

    @handles(OomKill)
    def _oom(self, ev: OomKill, out: list[object]) -> None:
        log.warning("OOM killer chose pid %d (%s): anon rss %d kB, file rss %d kB, shmem %d kB; "
                    "allocation by pid %d", ev.pid, ev.comm or "?", ev.anon_rss // 1024, ev.file_rss // 1024,
                    ev.shmem_rss // 1024, ev.trigger_pid)
        attrs: Attributes = {
                 "process.pid": ev.pid, "process.executable.name": ev.comm, "process.oom.total_vm": ev.total_vm,
                 "process.oom.anon_rss": ev.anon_rss, "process.oom.file_rss": ev.file_rss,
                 "process.oom.shmem_rss": ev.shmem_rss, "process.oom.score_adj": ev.oom_score_adj,
                 "process.oom.trigger_pid": ev.trigger_pid, "user.id": ev.uid}
        out.append(SpanRecord(ev.pid, "process.oom_kill", ev.time_ns, ev.time_ns, attrs, scope=SCOPE,
                              error="oom_kill", comm=ev.comm or None))
        self.metric(out, ev.pid, "process.oom_kills", 1)
