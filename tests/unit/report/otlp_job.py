"""A small synthetic multi-rank job written as OTLP JSON lines by the real file exporters
(otel_ebpf.emit.jsonfile over the OTel SDK), with known answers for the report, Perfetto and
Parquet tests.

Job: 4 ranks (0, 1 on node-0; 2, 3 on node-1), ``collectives`` AllReduce collectives 100 ms
apart on communicator ``c0ffee``; rank 3 arrives 30 ms late to every one; the last one is
partial (rank 1 missing, one ``nccl.desync`` event). One cudaMemcpyAsync per rank and
collective lasting 1 ms, except rank 2's in collective 1, which lasts 50 ms (the slowest
call). Metrics: two collections of launch counts (counter), copy sizes (histogram) per rank,
and ``otel_ebpf.events.dropped{receiver=cuda,reason=ringbuf_full}`` = 7 on the agent.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode

from otel_ebpf.emit.jsonfile import JsonLinesMetricExporter, JsonLinesSpanExporter

RANKS = 4
STRAGGLER, STRAGGLER_HOST, LATE_NS = 3, "node-1", 30_000_000
MISSING_RANK = 1
SLOW = (2, 1, 50_000_000)  # rank, collective, duration of the slowest cudaMemcpyAsync
DROPPED = 7


@dataclass(frozen=True)
class Job:
    directory: Path
    collectives: int
    base_ns: int

    @property
    def rank_spans(self) -> int:  # per-rank ncclAllReduce spans (the missing rank skips the last)
        return self.collectives * RANKS - 1

    @property
    def cuda_spans(self) -> int:
        return self.collectives * RANKS - 1

    @property
    def spans(self) -> int:
        return self.rank_spans + self.cuda_spans + self.collectives


def host(rank: int) -> str:
    return f"node-{rank // 2}"


def _rank_resource(rank: int) -> Resource:
    return Resource.create({"service.name": "train", "host.name": host(rank), "process.pid": 1000 + rank,
                            "process.executable.name": "python3", "ml.rank": rank, "ml.world_size": RANKS})


def _rank_spans(exporter: JsonLinesSpanExporter, rank: int, n: int, base: int) -> None:
    provider = TracerProvider(resource=_rank_resource(rank))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    nccl, cuda = provider.get_tracer("otel_ebpf.nccl"), provider.get_tracer("otel_ebpf.cuda")
    for seq in range(n):
        if rank == MISSING_RANK and seq == n - 1:
            continue  # crashed before the last collective
        start = base + seq * 100_000_000 + rank * 1_000_000 + (LATE_NS if rank == STRAGGLER else 0)
        s = nccl.start_span("ncclAllReduce", start_time=start, attributes={
            "nccl.comm.id": "c0ffee", "nccl.seq": seq, "nccl.rank": rank, "nccl.nranks": RANKS,
            "nccl.op": "AllReduce", "thread.id": 2000 + rank})
        s.end(end_time=start + 5_000_000)
        dur = SLOW[2] if (rank, seq) == SLOW[:2] else 1_000_000
        c = cuda.start_span("cudaMemcpyAsync", start_time=start - 2 * dur, attributes={
            "cuda.bytes": 4096, "thread.id": 2000 + rank})
        if seq == 0:
            c.set_status(Status(StatusCode.ERROR, "cudaErrorInsufficientDriver"))
        c.end(end_time=start - dur)
    provider.shutdown()


def _roots(exporter: JsonLinesSpanExporter, n: int, base: int) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-ebpf-gateway", "host.name": "gw"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("otel_ebpf.collective_join")
    for seq in range(n):
        start = base + seq * 100_000_000
        attrs: dict[str, Any] = {"nccl.comm.id": "c0ffee", "nccl.seq": seq, "nccl.op": "AllReduce",
                                 "nccl.nranks": RANKS}
        if seq < n - 1:
            skew = STRAGGLER * 1_000_000 + LATE_NS + seq * 1000  # grows with seq: the last complete is max
            attrs.update({"nccl.ranks.arrived": RANKS, "nccl.skew_ns": skew, "nccl.straggler.rank": STRAGGLER,
                          "nccl.straggler.host": STRAGGLER_HOST})
        else:
            attrs.update({"nccl.ranks.arrived": RANKS - 1, "nccl.partial": True, "nccl.missing_ranks": (MISSING_RANK,)})
        s = tracer.start_span("nccl AllReduce", start_time=start, attributes=attrs)
        if seq == n - 1:
            s.add_event("nccl.desync", {"nccl.missing_ranks": (MISSING_RANK,), "nccl.waited_ns": 2_000_000_000},
                        timestamp=start + 60_000_000)
        s.end(end_time=start + 40_000_000)
    provider.shutdown()


def _metrics(exporter: JsonLinesMetricExporter) -> None:
    for rank in range(RANKS):
        reader = InMemoryMetricReader()
        provider = MeterProvider(resource=_rank_resource(rank), metric_readers=[reader])
        meter = provider.get_meter("otel_ebpf.cuda")
        launches = meter.create_counter("gpu.cuda.kernel.launch.calls", unit="{call}")
        copies = meter.create_histogram("gpu.cuda.memory.copies", unit="By")
        for step in (1, 2):
            launches.add(10 * step, {"cuda.device.index": 0})
            copies.record(4096 * step, {"cuda.device.index": 0})
            data = reader.get_metrics_data()
            assert data is not None
            exporter.export(data)
        provider.shutdown()
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=Resource.create({"service.name": "otel-ebpf", "host.name": "node-0"}),
                             metric_readers=[reader])
    provider.get_meter("otel_ebpf").create_counter("otel_ebpf.events.dropped").add(
        DROPPED, {"receiver": "cuda", "reason": "ringbuf_full"})
    data = reader.get_metrics_data()
    assert data is not None
    exporter.export(data)
    provider.shutdown()


def write_job(directory: Path, collectives: int = 6) -> Job:
    """Write traces.jsonl and metrics.jsonl of the job above into ``directory``."""
    base = time.time_ns() - 5_000_000_000
    spans = JsonLinesSpanExporter(directory)
    for rank in range(RANKS):
        _rank_spans(spans, rank, collectives, base)
    _roots(spans, collectives, base)
    _metrics(JsonLinesMetricExporter(directory))
    return Job(directory, collectives, base)
