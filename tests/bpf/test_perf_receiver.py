"""The perf-counter receiver on processes the test starts (needs root for perf_event_open on
another process; lives with the BPF tests, which run as root in CI).

Software counters prove the plumbing on any machine: a traced root forks a child that burns CPU
and sleeps; the root's inherited counters must include the child's CPU time and context
switches. Hardware counters are checked for what the machine has: counted where a PMU exists,
"perf counters not supported here" said exactly once where none does (most VMs)."""
from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from otel_ebpf.core.events import MetricRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.perf import Config as ProcessorConfig
from otel_ebpf.processors.perf import PerfProcessor
from otel_ebpf.receivers.perf import Config, create, perfevent
from otel_ebpf.receivers.perf.events import PerfCount
from otel_ebpf.receivers.perf.receiver import UNSUPPORTED

pytestmark = pytest.mark.bpf

SLEEPS = 30
# the root waits; its forked child burns ~0.3 s of CPU, sleeps SLEEPS times, and reports its CPU time
TREE = f"""
import os, sys, time
sys.stdin.readline()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    for _ in range({SLEEPS}):
        time.sleep(0.001)
    os.write(w, repr(time.process_time()).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 64).decode(), flush=True)
"""


def _run(events: list[str]) -> tuple[subprocess.Popen[str], list[PerfCount], float, Context]:
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ctx = Context(target_pids=[proc.pid])
    sink = ListConsumer()
    receiver = create(Config(events=events, interval=0.05), ctx, sink)
    try:
        receiver.start()
        out, _ = proc.communicate("go\n", timeout=60)
        time.sleep(0.1)
    finally:
        receiver.shutdown()
        receiver.shutdown()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return proc, [e for e in sink.events if isinstance(e, PerfCount)], float(out), ctx


def test_software_counters_include_forked_children(bpf_ready: None) -> None:
    proc, counts, child_cpu_s, ctx = _run(["task_clock", "context_switches"])
    assert {c.pid for c in counts} == {proc.pid}
    task_clock_s = sum(c.delta for c in counts if c.event == "task_clock") / 1e9
    # the child's CPU time (0.3 s busy loop) is in the root's inherited counter
    assert child_cpu_s >= 0.3
    assert child_cpu_s * 0.9 <= task_clock_s <= child_cpu_s + 2.0, (task_clock_s, child_cpu_s)
    assert sum(c.delta for c in counts if c.event == "context_switches") >= SLEEPS
    out = ListConsumer()
    PerfProcessor(ProcessorConfig(), ctx, out).consume(counts)
    metrics = [m for m in out.events if isinstance(m, MetricRecord)]
    assert {m.name for m in metrics} == {"process.cpu.task_clock", "process.context_switches"}
    assert sum(m.value for m in metrics if m.name == "process.cpu.task_clock") == pytest.approx(task_clock_s)


def test_hardware_counters_are_counted_or_reported_unsupported_once(bpf_ready: None,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    why = perfevent.hardware_unsupported()
    with caplog.at_level(logging.WARNING, logger="otel_ebpf.receivers.perf.receiver"):
        _proc, counts, _cpu, ctx = _run(["cycles", "instructions", "task_clock"])
    lines = [r.getMessage() for r in caplog.records if "perf counters not supported here" in r.getMessage()]
    if why is None:  # a PMU: the child's 0.3 s busy loop is hundreds of millions of cycles
        assert not lines
        assert sum(c.delta for c in counts if c.event == "cycles") > 10_000_000
        assert sum(c.delta for c in counts if c.event == "instructions") > 10_000_000
    else:
        assert len(lines) == 1 and why in lines[0]
        assert ctx.telemetry.get(UNSUPPORTED, receiver="perf", event="cycles") == 1
        assert ctx.telemetry.get(UNSUPPORTED, receiver="perf", event="instructions") == 1
        assert {c.event for c in counts} == {"task_clock"}  # the software counter still runs


def test_nothing_left_to_count_leaves_the_receiver_idle(bpf_ready: None) -> None:
    if perfevent.hardware_unsupported() is None:
        pytest.skip("this machine has a PMU: hardware counters are supported")
    r = create(Config(events=["cycles"]), Context(target_pids=[1]), ListConsumer())
    r.start()
    assert r.events == [] and r.disabled and r._thread is None
    r.shutdown()
