"""``otel-ebpf run`` with the apptrace and cuda receivers around an app using the tracepoints
SDK and the OTel SDK: in the exported OTLP file, the CUDA spans made inside ``tp.span("batch")``
are in the app's request trace with the batch span as parent (the real pipeline: receivers on
their threads, one worker through the processors, the file exporter)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.otlp_sink import spans_from_jsonl

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.bpf


def test_cuda_spans_of_a_tracepoint_block_join_the_app_trace(bpf_ready: None, cudart: Path, tmp_path: Path) -> None:
    config = tmp_path / "otel-ebpf.yaml"
    config.write_text("service:\n  pipelines:\n    default: {receivers: [cuda, apptrace], "
                      "processors: [cuda, apptrace], exporters: [file]}\n")
    config.chmod(0o600)
    out, app_out = tmp_path / "out", tmp_path / "app.json"
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--config", str(config), "--output", str(out),
                        "--", sys.executable, str(ROOT / "tests" / "bpf" / "tracepoints_app.py"), str(cudart),
                        str(app_out)], input="go\n", capture_output=True, text=True, timeout=180, cwd=ROOT,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    app = json.loads(app_out.read_text())
    assert app["enabled"] is True  # run -- CMD attaches before the command starts
    request = next(s for s in app["spans"] if s["name"] == "request")
    trace = request["trace_id"].to_bytes(16, "big")
    spans = [s for _, _, s in spans_from_jsonl(out / "traces.jsonl")]
    (batch,) = [s for s in spans if s.name == "batch"]
    assert batch.trace_id == trace and batch.parent_span_id == request["span_id"].to_bytes(8, "big")
    cuda = [s for s in spans if s.name in ("cudaMalloc", "cudaMemcpy")]
    inside = [s for s in cuda if s.parent_span_id == batch.span_id]
    assert sorted(s.name for s in inside) == ["cudaMalloc", "cudaMemcpy"]
    assert all(s.trace_id == trace for s in inside)
    (after,) = [s for s in cuda if s not in inside]  # the cudaMemcpy after the block: its own trace
    assert after.trace_id != trace and not after.parent_span_id
