"""The application tracepoints SDK against the real agent receivers: an app using the OTel SDK
opens a request span, fires a probe, and opens ``tp.span("batch")`` around REAL libcudart calls;
the agent's CUDA spans of that thread land in the app's trace as children of the batch span,
which is a child of the app's request span. Also: ``enabled`` follows the agent attaching."""
from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_ebpf.core.events import ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.apptrace import AppTraceProcessor
from otel_ebpf.processors.apptrace import Config as AppProcessorConfig
from otel_ebpf.processors.cuda import Config as CudaProcessorConfig
from otel_ebpf.processors.cuda import CudaProcessor
from otel_ebpf.receivers import apptrace, cuda
from otel_ebpf.receivers.apptrace.events import AppPoint, AppSpan

pytestmark = pytest.mark.bpf

APP = Path(__file__).resolve().with_name("tracepoints_app.py")


def test_cuda_spans_join_the_app_trace_under_its_tracepoint_span(bpf_ready: None, cudart: Path,
                                                                  tmp_path: Path) -> None:
    from otel_ebpf import tracepoints
    assert tracepoints.AVAILABLE, "the _oetp extension is not built (pip install -e . builds it)"
    out = tmp_path / "app.json"
    proc = subprocess.Popen([sys.executable, str(APP), str(cudart), str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    receivers = []
    try:
        assert proc.stdout is not None
        assert select.select([proc.stdout], [], [], 60)[0], "the app never printed 'ready'"
        line = proc.stdout.readline()
        assert line.strip().endswith("enabled=False"), line  # nothing attached yet
        ctx, sink = Context(target_pids=[proc.pid]), ListConsumer()
        receivers = [apptrace.create(apptrace.Config(), ctx, sink),
                     cuda.create(cuda.Config(), ctx, sink)]
        for r in receivers:
            r.start()
        proc.communicate("go\n", timeout=60)
        assert proc.returncode == 0
        deadline = time.monotonic() + 10
        while sum(isinstance(e, ProcessExit) and e.pid == proc.pid for e in sink.events) < 2:
            assert time.monotonic() < deadline, "no ProcessExit from both receivers"
            time.sleep(0.02)
    finally:
        for r in receivers:
            r.shutdown()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    app = json.loads(out.read_text())
    assert app["enabled"] is True and app["rcs"] == [35, 35, 35]  # cudaErrorInsufficientDriver: no GPU
    spans = {s["name"]: s for s in app["spans"]}
    request, inner = spans["request"], spans["inner"]

    events = sink.take()
    point = next(e for e in events if isinstance(e, AppPoint))
    assert (point.provider, point.name, dict(point.attributes)) == ("testapp", "model_loaded",
                                                                    {"model": "resnet50", "version": 3})
    assert (point.trace_id, point.parent_span_id) == (request["trace_id"], request["span_id"])
    batch = next(e for e in events if isinstance(e, AppSpan))
    assert (batch.name, dict(batch.attributes)) == ("batch", {"size": 4})
    assert (batch.trace_id, batch.parent_span_id) == (request["trace_id"], request["span_id"])
    # the app's own span opened inside tp.span("batch") is its child too
    assert (inner["trace_id"], inner["parent"]) == (batch.trace_id, batch.span_id)

    records = ListConsumer()
    AppTraceProcessor(AppProcessorConfig(), ctx, CudaProcessor(CudaProcessorConfig(), ctx, records)).consume(events)
    by_name: dict[str, list[SpanRecord]] = {}
    for r in records.events:
        if isinstance(r, SpanRecord):
            by_name.setdefault(r.name, []).append(r)
    (malloc,), (memcpy_in, memcpy_after) = by_name["cudaMalloc"], by_name["cudaMemcpy"]
    for span in (malloc, memcpy_in):
        assert (span.trace_id, span.parent_span_id) == (request["trace_id"], batch.span_id), span
        assert batch.start_ns <= span.start_ns <= span.end_ns <= batch.end_ns
    assert memcpy_after.trace_id is None and memcpy_after.parent_span_id is None  # after the batch ended
    (batch_rec,) = by_name["batch"]
    assert (batch_rec.trace_id, batch_rec.span_id, batch_rec.parent_span_id) == (
        request["trace_id"], batch.span_id, request["span_id"])
    assert ctx.telemetry.get("otel_ebpf.events.dropped", receiver="apptrace") == 0


def test_enabled_follows_the_agent_in_every_process_mapping_the_sdk(bpf_ready: None) -> None:
    """Node-agent mode (no target pids): attaching sets the semaphore of this very process (the
    kernel bumps it in every process mapping the file), detaching clears it."""
    from otel_ebpf import tracepoints
    assert tracepoints.AVAILABLE
    assert not tracepoints.enabled()
    receiver = apptrace.create(apptrace.Config(), Context(), ListConsumer())
    try:
        receiver.start()
        assert tracepoints.enabled()
        probe = tracepoints.Provider("self").probe("tick", n=int)
        assert probe.enabled
    finally:
        receiver.shutdown()
    assert not tracepoints.enabled()
    receiver.shutdown()
