"""A CPU PyTorch job, shaped like what ``otel-ebpf run`` writes with the lifecycle, python, torch and
memory receivers (no GPU, no NCCL), written as OTLP JSON lines by the real file exporters
(otel_ebpf.emit.jsonfile) with known answers for the report tests.

Job (times from the process's fork, ``base``): one process, pid 4242, lives 12.8 s (the lifecycle
processor's ``process python3.11`` span). Its main thread runs ``job.train`` (1.0 s to 12.0 s)
with ``STEPS`` nested ``job.step`` calls, each holding a ``job.forward`` call and the torch
operators ``linear`` > ``addmm``; a side thread (tid 4250) runs ``job.worker`` calls with a
``mm`` operator each. Metrics, as the agent reads them every second: RSS
(``process.memory.usage``, an up-down counter) from 0.3 s to 12.3 s, then 0 at 13.3 s after the
exit (the memory processor returns it to 0); ``process.cpu.time`` (a counter) on the same
readings; the host's ``system.disk.io`` read from 9.7 s before the fork (the agent starts
before the command) to 14.3 s; ``pytorch.op.duration`` (a histogram) read twice; the agent's
``otel_ebpf.events.dropped{reason=stack_too_deep}`` (deep stacks not nested: not lost).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.sdk.metrics.export import (AggregationTemporality, Histogram, HistogramDataPoint, Metric,
                                              MetricsData, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ebpf.emit.jsonfile import JsonLinesMetricExporter, JsonLinesSpanExporter

PID, SIDE_TID, HOST, EXE = 4242, 4250, "cpu-box", "python3.11"
LIFE_NS = 12_800_000_000
STEPS, WORKER_CALLS = 40, 20
DEEP_PYTHON, DEEP_TORCH = 86_593, 12  # stack_too_deep counts of the python and torch receivers
RSS_MIB = [30 + 25 * i for i in range(13)]  # readings at 0.3 s + i s
S = 1_000_000_000
MS = 1_000_000


@dataclass(frozen=True)
class Job:
    directory: Path
    base_ns: int

    @property
    def spans(self) -> int:  # process + train + steps x (step, forward, linear, addmm) + worker calls x 2
        return 2 + STEPS * 4 + WORKER_CALLS * 2


def _resource() -> Resource:
    return Resource.create({"service.name": EXE, "host.name": HOST, "process.pid": PID,
                            "process.executable.name": EXE, "process.command_line": "python train_cpu.py"})


def _span(tracer, name: str, start: int, end: int, **attrs) -> None:  # type: ignore[no-untyped-def]
    tracer.start_span(name, start_time=start, attributes=attrs).end(end_time=end)


def _spans(directory: Path, base: int) -> None:
    provider = TracerProvider(resource=_resource())
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(directory)))
    life, py, torch = (provider.get_tracer(f"otel_ebpf.{n}") for n in ("lifecycle", "python", "torch"))
    _span(life, f"process {EXE}", base, base + LIFE_NS, **{"process.pid": PID, "process.exit.code": 0,
                                                           "process.command_line": "python train_cpu.py"})
    _span(py, "job.train", base + 1 * S, base + 12 * S, **{"thread.id": PID, "python.call.depth": 2})
    for i in range(STEPS):
        t = base + 1 * S + 50 * MS + i * 270 * MS
        _span(py, "job.step", t, t + 250 * MS, **{"thread.id": PID, "python.call.depth": 3})
        _span(py, "job.forward", t + 10 * MS, t + 120 * MS, **{"thread.id": PID, "python.call.depth": 4})
        _span(torch, "linear", t + 20 * MS, t + 100 * MS, **{"thread.id": PID, "pytorch.op.depth": 0})
        _span(torch, "addmm", t + 25 * MS, t + 95 * MS, **{"thread.id": PID, "pytorch.op.depth": 1})
    for i in range(WORKER_CALLS):
        t = base + 2 * S + i * 400 * MS
        _span(py, "job.worker", t, t + 300 * MS, **{"thread.id": SIDE_TID, "python.call.depth": 1})
        _span(torch, "mm", t + 100 * MS, t + 150 * MS, **{"thread.id": SIDE_TID, "pytorch.op.depth": 0})
    provider.shutdown()


def _sum(name: str, unit: str, points: list[NumberDataPoint], monotonic: bool) -> Metric:
    return Metric(name, "", unit, Sum(points, AggregationTemporality.CUMULATIVE, monotonic))


def _collection(base: int, i: int) -> list[ResourceMetrics]:
    """The agent's collection at 0.3 s + i s (i from -10): the process's metrics while it lives
    (and once after its exit), the host's and the agent's own every time."""
    now = base + 300 * MS + i * S
    out = []
    host = [_sum("system.disk.io", "By", [NumberDataPoint({"disk.io.direction": "write", "system.device": "vda"},
                                                          base - 10 * S, now, 5_000_000 + 40_000 * (i + 10))], True)]
    agent = [_sum("otel_ebpf.events.dropped", "1", [
        NumberDataPoint({"receiver": "python", "reason": "stack_too_deep"}, base - 10 * S, now,
                        DEEP_PYTHON if i >= 1 else 0),
        NumberDataPoint({"receiver": "torch", "reason": "stack_too_deep"}, base - 10 * S, now,
                        DEEP_TORCH if i >= 1 else 0)], True)]
    agent_res = Resource.create({"service.name": "otel-ebpf", "host.name": HOST})
    out.append(ResourceMetrics(agent_res, [ScopeMetrics(InstrumentationScope("otel_ebpf.blockio"), host, ""),
                                           ScopeMetrics(InstrumentationScope("otel_ebpf"), agent, "")], ""))
    if 0 <= i <= 13:
        rss = RSS_MIB[i] * 1024 * 1024 if i < len(RSS_MIB) else 0  # 0: after the exit, state returned
        proc = [_sum("process.memory.usage", "By", [NumberDataPoint({}, base, now, rss)], False),
                _sum("process.cpu.time", "s", [NumberDataPoint({}, base, now, 0.8 * min(i, 12))], True)]
        if i in (10, 11):
            proc.append(Metric("pytorch.op.duration", "", "s", Histogram(
                [HistogramDataPoint({"pytorch.op.name": "addmm"}, base, now, 40 * (i - 9), 2.8 * (i - 9),
                                    [0, 40 * (i - 9)], [0.01], 0.07, 0.07)], AggregationTemporality.CUMULATIVE)))
        out.append(ResourceMetrics(_resource(), [ScopeMetrics(InstrumentationScope("otel_ebpf.memory"), proc, "")],
                                   ""))
    return out


def write_job(directory: Path) -> Job:
    """Write traces.jsonl and metrics.jsonl of the job above into ``directory``."""
    base = time.time_ns() - 30 * S
    _spans(directory, base)
    metrics = JsonLinesMetricExporter(directory)
    for i in range(-10, 15):
        metrics.export(MetricsData(_collection(base, i)))
    return Job(directory, base)
