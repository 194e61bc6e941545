"""Sched events (otel_ebpf/receivers/sched) -> MetricRecord; everything else passes unchanged.

Metrics (scope ``otel_ebpf.sched``, per process resource; semconv names where they exist):

* ``process.cpu.time`` counter s: on-CPU time (no ``cpu.mode``: the scheduler does not split
  user from system time).
* ``process.sched.cpu.time`` counter s, by ``cpu.logical_number``: on-CPU time per core.
* ``process.sched.off_cpu.time`` counter s, by ``process.sched.off_cpu.reason`` (``sleep``,
  ``io``, ``lock``, ``other``): time blocked, from switch-out to wakeup.
* ``process.sched.runq.time`` counter s: time runnable but waiting for a CPU.
* ``process.sched.runq.latency`` histogram s: each wait in the run queue (in-kernel log2
  buckets; each is reported at 1.5 x its lower bound, so values are within x1.5).
* ``process.context_switches`` counter {context_switch}, by ``process.context_switch.type``
  (``voluntary``: the thread blocked; ``involuntary``: preempted or yielded while runnable).

The ``process`` lifecycle spans this processor made before issue 18 are the ``lifecycle``
processor's (otel_ebpf/processors/lifecycle), on by default.

Threading: single-threaded (the pipeline worker); ``consume`` never raises.
"""
from __future__ import annotations

from opentelemetry.semconv._incubating.attributes import cpu_attributes as cpu
from opentelemetry.semconv._incubating.attributes import process_attributes as pa
from opentelemetry.semconv._incubating.metrics import process_metrics as pm

from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles

from ...receivers.sched.events import OFF_CPU_REASONS, SchedCpuStats, SchedProcStats
from .config import Config

__all__ = ["METRICS", "SCOPE", "SchedProcessor", "bucket_value"]

SCOPE = "otel_ebpf.sched"
TELEMETRY_NAME = "sched"
REASON = "process.sched.off_cpu.reason"
# name -> (kind, unit, description)
METRICS: dict[str, MetricSpec] = {
    pm.PROCESS_CPU_TIME: ("counter", "s", "On-CPU time of the process's threads."),
    "process.sched.cpu.time": ("counter", "s", "On-CPU time per logical CPU core."),
    "process.sched.off_cpu.time": ("counter", "s", "Time threads were blocked (switch-out to wakeup), by reason."),
    "process.sched.runq.time": ("counter", "s", "Time threads were runnable but waiting for a CPU."),
    "process.sched.runq.latency": ("histogram", "s", "Run-queue waits (wakeup or preemption to switch-in)."),
    pm.PROCESS_CONTEXT_SWITCHES: ("counter", "{context_switch}", "Context switches, by type."),
}


def bucket_value(slot: int) -> float:
    """Seconds reported for log2 bucket ``slot`` ([2^slot, 2^(slot+1)) ns)."""
    return (1.5 * (1 << slot)) / 1e9


class SchedProcessor(EventProcessor[Config]):
    """Processor ``sched``: stateless, one batch of metric records per batch of events."""

    NAME = TELEMETRY_NAME
    SCOPE = SCOPE
    METRICS = METRICS

    # ---- metrics ---------------------------------------------------------------------
    @handles(SchedProcStats)
    def _proc_stats(self, ev: SchedProcStats, out: list[object]) -> None:
        pid = ev.pid
        if ev.on_cpu_ns:
            self.metric(out, pid, pm.PROCESS_CPU_TIME, ev.on_cpu_ns / 1e9, {})
        for reason, ns in zip(OFF_CPU_REASONS, ev.off_cpu_ns, strict=True):
            if ns:
                self.metric(out, pid, "process.sched.off_cpu.time", ns / 1e9, {REASON: reason})
        if ev.runq_ns:
            self.metric(out, pid, "process.sched.runq.time", ev.runq_ns / 1e9, {})
        for kind, n in (("voluntary", ev.voluntary), ("involuntary", ev.involuntary)):
            if n:
                self.metric(out, pid, pm.PROCESS_CONTEXT_SWITCHES, n, {pa.PROCESS_CONTEXT_SWITCH_TYPE: kind})
        for slot, n in ev.runq_hist:
            self.metric(out, pid, "process.sched.runq.latency", bucket_value(slot), {}, count=n)

    @handles(SchedCpuStats)
    def _cpu_stats(self, ev: SchedCpuStats, out: list[object]) -> None:
        if ev.on_cpu_ns:
            self.metric(out, ev.pid, "process.sched.cpu.time", ev.on_cpu_ns / 1e9, {cpu.CPU_LOGICAL_NUMBER: ev.cpu})
