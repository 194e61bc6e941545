"""The sched receiver's real tracepoints on processes the test starts.

Each test starts ``sh -c 'read go; SCRIPT'`` (traced from before its first instruction of
interest), loads the receiver with that shell as the traced root, then lets it go. Every wait
is bounded; tolerances allow for the 2 shared CPUs of CI machines.
"""
from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.core.events import MetricRecord, SpanRecord
from otel_ebpf.host.timeline import HostStats
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.nccl import Config as NcclProcessorConfig
from otel_ebpf.processors.nccl.processor import NcclProcessor
from otel_ebpf.processors.sched import Config as ProcessorConfig
from otel_ebpf.processors.sched import SchedProcessor
from otel_ebpf.receivers import nccl as nccl_receiver
from otel_ebpf.processors.lifecycle import Config as LifecycleProcessorConfig
from otel_ebpf.processors.lifecycle import LifecycleProcessor
from otel_ebpf.receivers.lifecycle import Config as LifecycleConfig
from otel_ebpf.receivers.lifecycle import LifecycleReceiver
from otel_ebpf.receivers.sched import Config, SchedReceiver
from otel_ebpf.receivers.sched.events import SchedCpuStats, SchedProcStats

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent

MS = 1_000_000


@dataclass
class Run:
    child: subprocess.Popen[str]
    receiver: SchedReceiver
    ctx: Context
    sink: ListConsumer
    events: list[object]


@contextlib.contextmanager
def traced(script: str, **cfg: object) -> Iterator[Run]:
    """The receiver tracing ``script`` (a shell command line); events collected after the
    receiver shut down are in ``run.events``."""
    child = subprocess.Popen(["/bin/sh", "-c", "read go; " + script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    ctx, sink = Context(target_pids=[child.pid]), ListConsumer()
    ctx.host_stats = HostStats(ctx.telemetry)
    receiver = SchedReceiver(Config(**cfg), ctx, sink)  # type: ignore[arg-type]
    run = Run(child, receiver, ctx, sink, [])
    try:
        receiver.start()
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        yield run
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)
        receiver.shutdown()
        run.events = sink.take()


def _sum_stats(events: list[object], pids: set[int]) -> dict[str, int]:
    total = {"on": 0, "sleep": 0, "io": 0, "lock": 0, "other": 0, "runq": 0, "vol": 0, "invol": 0, "waits": 0}
    for e in events:
        if isinstance(e, SchedProcStats) and e.pid in pids:
            total["on"] += e.on_cpu_ns
            for k, v in zip(("sleep", "io", "lock", "other"), e.off_cpu_ns, strict=True):
                total[k] += v
            total["runq"] += e.runq_ns
            total["vol"] += e.voluntary
            total["invol"] += e.involuntary
            total["waits"] += sum(n for _, n in e.runq_hist)
    return total


SPIN_SLEEP = """
import os, sys, time
print("up", flush=True); sys.stdin.readline()
def spin(s):
    c = time.process_time()
    while time.process_time() < c + s:
        pass
t0 = time.time_ns(); spin(0.25); t1 = time.time_ns(); time.sleep(0.3); t2 = time.time_ns(); spin(0.1)
t3 = time.time_ns()
cpu = os.times()
print(t0, t1, t2, t3, int((cpu.user + cpu.system) * 1e9), flush=True)
sys.stdin.readline()
"""


def _on_cpu_samples(stats: Any, pid: int, t0: int) -> list[tuple[float, float]]:
    """(ms after t0, on-CPU ms) of the thread's on_cpu_ns samples, for a failure's message."""
    series = stats._series.get((pid, pid), {}).get("on_cpu_ns")
    if series is None:
        return []
    return [(round((t - t0) / 1e6, 1), round(v / 1e6, 1)) for t, v in zip(series.times, series.values, strict=True)]


def _stolen_ns() -> int:
    """The hypervisor's steal so far, all CPUs together (/proc/stat). The kernel's on-CPU time,
    timed sched_switch to sched_switch, holds the steal of the time a thread ran; its CPU clock
    (``process_time``, ``os.times``) leaves it out: on a busy CI VM a spin of 100 ms of CPU was
    141 ms on-CPU."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def test_spin_then_sleep_gives_on_and_off_cpu_time_and_per_thread_step_figures(bpf_ready: None) -> None:
    with traced(f"exec {sys.executable} -c '{SPIN_SLEEP}'", stats_interval=0.1) as run:
        pid = run.child.pid
        stats = run.ctx.host_stats
        assert run.child.stdout is not None and run.child.stdin is not None and stats is not None
        assert run.child.stdout.readline() == "up\n"
        steal0 = _stolen_ns()
        stats.watch(pid, pid)
        stats.fresh(pid, pid, time.time_ns())  # a sample before t0, however late the poll thread is
        assert "on_cpu_ns" in stats.delta(pid, time.time_ns(), time.time_ns(), tid=pid)
        run.child.stdin.write("\n")
        run.child.stdin.flush()
        t0, t1, t2, t3, cpu_ns = map(int, run.child.stdout.readline().split())
        stats.fresh(pid, pid, t3)  # a sample after t3
        spin = run.ctx.host_stats.delta(pid, t0, t1, tid=pid)
        sleep = run.ctx.host_stats.delta(pid, t1, t2, tid=pid)
        samples = _on_cpu_samples(stats, pid, t0)
        stolen = _stolen_ns() - steal0
        run.child.stdin.write("\n")
        run.child.stdin.flush()
    # seen twice (session 20, all of tests/bpf: 66 ms for the 250 ms spin; session 31's fresh-clone CI: 118 ms, its
    # CPU clock 250 ms in 250.6 ms of wall, its on-CPU samples flat for 100 ms): a run whose switch-in the program
    # did not see is not counted on-CPU, and is counted in otel_ebpf.sched.switches_missed. So the figure is within
    # bounds, or short and the receiver says it missed a switch-in.
    missed = run.ctx.telemetry.get("otel_ebpf.sched.switches_missed")
    why = (t1 - t0, t2 - t0, t3 - t0, stolen, missed, samples)
    assert spin["on_cpu_ns"] <= 1.2 * 0.25e9 + stolen, why
    assert 0.8 * 0.25e9 <= spin["on_cpu_ns"] or missed > 0, why
    assert spin["off_cpu_sleep_ns"] < 0.05e9
    assert sleep["off_cpu_sleep_ns"] == pytest.approx(0.3e9, rel=0.2)
    assert sleep["on_cpu_ns"] < 0.05e9
    total = _sum_stats(run.events, {pid})
    # the kernel's own figure for the process's CPU time (os.times) against ours
    assert total["on"] <= 1.15 * cpu_ns + 30 * MS + stolen, (total["on"], cpu_ns, stolen)
    assert 0.85 * cpu_ns - 30 * MS <= total["on"] or missed > 0, (total["on"], cpu_ns, stolen, missed)
    assert 0.3e9 <= total["sleep"] + total["lock"] < 0.3e9 + (t3 - t0) + 2e9  # + the wait for our "\n"
    # the sleep is the one certain voluntary switch: a readline blocks only when the test's line
    # is not there yet (on a loaded VM it can be: seen once, 1 voluntary switch)
    assert total["vol"] >= 1
    cpus = [e for e in run.events if isinstance(e, SchedCpuStats) and e.pid == pid]
    assert sum(e.on_cpu_ns for e in cpus) == total["on"]


def test_two_spinners_on_one_cpu_wait_in_the_run_queue(bpf_ready: None) -> None:
    spin = "i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done"
    script = f"taskset -c 0 sh -c '{spin}' & taskset -c 0 sh -c '{spin}' & wait"
    with traced(script, stats_interval=0.1) as run:
        run.child.wait(timeout=120)
    # the shell's two children (taskset, then the sh it execs: the same pid) are the spinners
    spinners = {e.pid for e in run.events if isinstance(e, SchedProcStats)} - {run.child.pid}
    assert len(spinners) == 2, spinners
    total = _sum_stats(run.events, spinners)
    assert total["invol"] > 0 and total["waits"] > 0
    assert total["runq"] >= 0.2 * total["on"] / 2  # each waits while the other runs
    by_core: dict[int, int] = {}
    for e in run.events:
        if isinstance(e, SchedCpuStats) and e.pid in spinners:
            by_core[e.cpu] = by_core.get(e.cpu, 0) + e.on_cpu_ns
    # taskset itself may run elsewhere before it pins the process and execs sh
    assert by_core.get(0, 0) >= 0.9 * sum(by_core.values()) > 0


def test_runq_latency_histogram_sums_to_runq_time_within_its_bucket_error(bpf_ready: None) -> None:
    """Every run-queue wait is added to ``runq_ns`` and counted in one log2 slot; reported through
    the processor, the histogram's sum (each wait at 1.5 x its slot's lower bound) lies within
    x1.5 of ``process.sched.runq.time`` (docs/receivers.md). Issue 18 saw ~2x: the slots were
    read one power of two too high."""
    spin = "i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done"
    script = f"taskset -c 0 sh -c '{spin}' & taskset -c 0 sh -c '{spin}' & wait"
    with traced(script, stats_interval=0.1) as run:
        run.child.wait(timeout=120)
    sink = ListConsumer()
    proc = SchedProcessor(ProcessorConfig(), run.ctx, sink)
    proc.consume(run.events)
    proc.shutdown()
    records = [m for m in sink.take() if isinstance(m, MetricRecord)]
    runq = sum(m.value * m.count for m in records if m.name == "process.sched.runq.time")
    latency = sum(m.value * m.count for m in records if m.name == "process.sched.runq.latency")
    waits = sum(m.count for m in records if m.name == "process.sched.runq.latency")
    assert runq > 0.05 and waits > 10  # the spinners did wait for each other
    assert runq / 1.5 <= latency <= runq * 1.5, (latency, runq)


LOCK = """
import threading
lock = threading.Lock()
lock.acquire()
threading.Timer(0.3, lock.release).start()
lock.acquire()
"""


def test_waiting_on_a_lock_is_off_cpu_reason_lock(bpf_ready: None) -> None:
    with traced(f"exec {sys.executable} -c '{LOCK}'", stats_interval=0.1) as run:
        run.child.wait(timeout=60)
    total = _sum_stats(run.events, {run.child.pid})
    assert total["lock"] >= 0.25e9
    assert total["lock"] < 1e9


def test_collective_spans_carry_the_host_figures_of_the_step_before_them(
        bpf_ready: None, built: dict[str, Path], tmp_path: Path) -> None:
    """sched_rank.c: between AllReduce #1 and #2 it spins 100 ms of CPU (and says how long that
    took), between #2 and #3 it sleeps 150 ms; the NCCL processor, fed live, puts those figures
    on #2 and #3."""
    exe = tmp_path / "sched_rank"
    subprocess.run(["gcc", "-O1", "-Wall", "-Wextra", "-Werror", "-o", str(exe), str(HERE / "sched_rank.c"), "-ldl"],
                   check=True, capture_output=True, timeout=60)
    proc = subprocess.Popen([str(exe), str(built["stand_in_nccl"])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    receivers: list[object] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert select.select([proc.stdout], [], [], 30)[0], "sched_rank never printed 'ready'"
        assert proc.stdout.readline().startswith("ready pid=")
        ctx, sink = Context(target_pids=[proc.pid]), ListConsumer()
        ctx.host_stats = HostStats(ctx.telemetry)
        sched = SchedReceiver(Config(), ctx, ListConsumer())
        receivers.append(sched)
        sched.start()
        nccl = nccl_receiver.factory.create(nccl_receiver.Config(), ctx,
                                            NcclProcessor(NcclProcessorConfig(host="h"), ctx, sink))
        receivers.append(nccl)
        nccl.start()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "done" in out
        time.sleep(0.3)  # the last records
    finally:
        for r in reversed(receivers):
            r.shutdown()  # type: ignore[attr-defined]
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    spans = sorted((e for e in sink.events if isinstance(e, SpanRecord) and e.name == "ncclAllReduce"),
                   key=lambda s: s.start_ns)
    assert len(spans) == 4
    assert "ml.step.interval.duration" not in spans[0].attributes  # no step before the first
    spin, sleep = spans[2].attributes, spans[3].attributes
    # The spin is 100 ms of the thread's CPU clock. The kernel's on-CPU time (sched_switch to
    # sched_switch) also holds what the hypervisor stole meanwhile, and time preempted by another
    # task is run-queue time: together they are the spin's wall time (CI: 141 ms on-CPU for a
    # 100 ms spin on a busy VM).
    figures = dict(kv.split("=") for kv in out.split()[1:])
    spin_wall, spin_cpu = float(figures["spin_wall"]), float(figures["spin_cpu"])
    on_cpu = spin["ml.step.on_cpu.duration"]
    assert on_cpu + spin.get("ml.step.runq.duration", 0.0) == pytest.approx(spin_wall, abs=0.03)
    assert on_cpu > spin_cpu - 0.03
    assert spin["ml.step.off_cpu.duration"] < 0.04  # the sleep before it, smeared over one sample interval
    assert sleep["ml.step.off_cpu.sleep.duration"] == pytest.approx(0.15, rel=0.3)
    assert sleep["ml.step.off_cpu.duration"] == pytest.approx(0.15, rel=0.3)
    assert sleep["ml.step.on_cpu.duration"] < 0.03
    assert sleep["ml.step.interval.duration"] == pytest.approx(0.15, rel=0.3)


def test_a_process_resource_follows_its_exec_through_the_emitter(bpf_ready: None) -> None:
    """Issue 18: the shell spins (its sched figures reach the Emitter, building its resource from
    /proc: ``sh -c ...``), then execs Python. The exec's re-read replaces the resource: the
    process span (the lifecycle receiver's, loaded alongside), ended after the exec, and Python's
    figures carry Python's command line."""
    from otel_ebpf.emit.emitter import Emitter, ExporterSpec
    from otel_ebpf.host.processes import ResourceCache
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from tests.unit.emit.test_emitter import StoringMetricExporter

    spans, metrics = InMemorySpanExporter(), StoringMetricExporter()
    code = "import time; time.sleep(0.4)"
    script = f"i=0; while [ $i -lt 60000 ]; do i=$((i+1)); done; sleep 0.3; exec {sys.executable} -c '{code}'"
    child = subprocess.Popen(["/bin/sh", "-c", "read go; " + script], stdin=subprocess.PIPE, text=True)
    ctx = Context(target_pids=[child.pid])
    cache = ctx.resources = ResourceCache()
    emitter = Emitter([ExporterSpec("mem", spans, metrics, batch_delay=0.05)], ctx.telemetry,
                      resource_of=cache.get, agent_attributes={}, metrics_interval=3600)
    cache.subscribe(emitter.resource_changed)
    receiver = SchedReceiver(Config(stats_interval=0.05), ctx, SchedProcessor(ProcessorConfig(), ctx, emitter))
    lifecycle = LifecycleReceiver(LifecycleConfig(), ctx, LifecycleProcessor(LifecycleProcessorConfig(), ctx, emitter))
    try:
        lifecycle.start()
        receiver.start()
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        receiver.shutdown()
        lifecycle.shutdown()
        emitter.flush(10)
        emitter.shutdown()
    lines = {rm.resource.attributes.get("process.command_line") for data in metrics.exports
             for rm in data.resource_metrics if rm.resource.attributes.get("process.pid") == child.pid}
    assert any(line.startswith("/bin/sh -c read go;") for line in lines), lines  # seen before the exec
    assert f"{sys.executable} -c {code}" in lines, lines
    (span,) = [s for s in spans.get_finished_spans() if s.attributes.get("process.pid") == child.pid]
    assert span.resource.attributes["process.command_line"] == f"{sys.executable} -c {code}"


def test_a_run_whose_switch_in_was_not_seen_is_counted_missed(bpf_ready: None) -> None:
    """The state the kernel leaves when it skips the program on a switch-in (on_ts 0, off_ts set, the thread
    running), written into the thread's entry while it spins: its next switch-out is counted in
    otel_ebpf.sched.switches_missed, and a thread the program saw switching in is not."""
    import ctypes as ct

    spin = "import time\nprint(\"up\", flush=True)\nend = time.time() + 3\nwhile time.time() < end:\n    pass\n"
    with traced(f"exec {sys.executable} -c '{spin}'", stats_interval=0.05) as run:
        assert run.child.stdout is not None and run.child.stdout.readline() == "up\n"
        pid, threads = run.child.pid, run.receiver.bpf["threads"]
        time.sleep(0.3)
        assert run.ctx.telemetry.get("otel_ebpf.sched.switches_missed") == 0  # every switch-in seen so far
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline and not run.ctx.telemetry.get("otel_ebpf.sched.switches_missed"):
            try:
                t = threads[ct.c_uint32(pid)]
            except KeyError:
                continue
            if t.on_ts:  # on CPU now: as if its switch-in had not been seen
                t.off_ts, t.on_ts = t.on_ts, 0
                threads[ct.c_uint32(pid)] = t
            time.sleep(0.05)
        assert run.ctx.telemetry.get("otel_ebpf.sched.switches_missed") >= 1
