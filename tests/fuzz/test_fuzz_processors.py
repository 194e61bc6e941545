"""Fuzzing processors and emit with events whose every field is random within what the kernel
can hand over: each event is *decoded* from a random, well-typed BPF record (so pids are u32,
pointers u64, return codes i32, tables indexed in range), interleaved with process exits, in
random order. The whole path receiver-decode -> processor -> Emitter -> OTLP protobuf encoding
must neither raise nor lose a span silently: every span the emitter took is encodable.

Known and accepted: a u64 field above 2**63-1 (a garbage ``count`` or stream handle) does not fit
OTLP's int64 ``int_value``; the SDK's encoder then drops that one attribute and logs an error, the
span itself is exported (see docs/reliability.md)."""
from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter, MetricExportResult
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.core.events import ProcessExit
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors import cuda as cuda_proc
from otel_ebpf.processors import nccl as nccl_proc
from otel_ebpf.receivers import cuda, nccl
from otel_ebpf.receivers.cuda.receiver import MIRRORS
from otel_ebpf.receivers.nccl.receiver import LAYOUTS
from otel_ebpf.core.telemetry import DROPPED

RECORDS = {"cuda": {m.etype: m.fmt for m in MIRRORS}, "nccl": {lay.etype: lay.struct for lay in LAYOUTS}}
TABLE_BYTES = {"cuda": (1,), "nccl": (1, 2)}  # api index / (op or kind, flags) bytes


class EncodingSpanExporter(SpanExporter):
    """Encodes every batch to OTLP protobuf, as the OTLP exporters do, and counts the spans."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence) -> SpanExportResult:
        encode_spans(spans).SerializeToString()
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class EncodingMetricExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__(preferred_temporality={}, preferred_aggregation={})
        self.batches = 0

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        encode_metrics(metrics_data).SerializeToString()
        self.batches += 1
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


_ = AggregationTemporality  # the SDK default temporality (cumulative) is what the agent uses


@st.composite
def decoded_events(draw: st.DrawFn, name: str, rx) -> list[object]:
    out: list[object] = []
    pids = st.sampled_from([1000, 1001, 0, 2**32 - 1])  # few pids, so state builds up per process
    for _ in range(draw(st.integers(1, 40))):
        if draw(st.integers(0, 9)) == 0:
            out.append(ProcessExit(draw(pids), draw(st.integers(0, 2**63)), "x", -1, source=name))
            continue
        etype = draw(st.sampled_from(sorted(RECORDS[name])))
        fmt = RECORDS[name][etype]
        body = bytearray(draw(st.binary(min_size=fmt.size, max_size=fmt.size)))
        body[0] = etype
        for i in TABLE_BYTES[name]:
            body[i] = draw(st.integers(0, 3))
        body[4:8] = draw(pids).to_bytes(4, "little")  # pid follows the 4-byte header in every record
        try:
            ev = rx.decode(etype, bytes(body))
        except Exception:  # out-of-range field: the receiver counts it as decode_error
            continue
        if ev is not None:
            out.append(ev)
    return out


@pytest.mark.parametrize("name", ["cuda", "nccl"])
def test_processor_and_emitter_take_any_decoded_events(name):
    ctx = Context()
    rfactory = {"cuda": cuda.factory, "nccl": nccl.factory}[name]
    pfactory = {"cuda": cuda_proc.factory, "nccl": nccl_proc.factory}[name]
    rx = rfactory.create(rfactory.config_class(), ctx, ListConsumer())
    # Kernel timestamps are CLOCK_MONOTONIC ns since boot: below 2**62 (146 years of uptime). A u64
    # beyond what the epoch conversion can add to would not fit OTLP's fixed64 times: not a real input.
    to_epoch = rx.clock.to_epoch_ns
    rx.clock.to_epoch_ns = lambda ts: to_epoch(ts % 2**62)
    spans, metrics = EncodingSpanExporter(), EncodingMetricExporter()
    emitter = Emitter([ExporterSpec("fuzz", spans, metrics, queue_size=100_000, batch_size=512, batch_delay=0.05)],
                      ctx.telemetry, resource_of=lambda pid, comm: {"process.pid": pid},
                      agent_attributes={"service.name": "otel-ebpf"}, max_processes=2, metrics_interval=3600)
    proc = pfactory.create(pfactory.config_class(), ctx, emitter)
    proc.start()

    examples = [0]

    @given(decoded_events(name, rx))
    def one(events: list[object]) -> None:
        examples[0] += 1
        proc.consume(events)
        emitter.flush()

    try:
        one()
        print(f"{name}: {examples[0]} examples")
    finally:
        proc.shutdown()
        emitter.shutdown()
    assert spans.spans == emitter.spans_emitted  # every span handed to the SDK was encoded
    assert ctx.telemetry.get(DROPPED, reason="bad_record") == 0
    assert ctx.telemetry.get(DROPPED, reason="export_queue_full") == 0
