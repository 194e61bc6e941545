"""``otel-ebpf run`` with the python and torch receivers enabled, on a Python job that imports
torch: the command is forked by the agent (a copy of the agent's own interpreter), attached
before its exec, and keeps its probes through the exec; libtorch_cpu is caught at openat.
The job sets a do-nothing C profile function: CPython 3.11-3.14 fire function__entry only
then (CPython gh-98894). Operator calls made inside a traced function nest under it, in its
trace; one made outside is in the trace of its thread's step, under a pytorch.step span."""
from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.otlp_sink import spans_from_jsonl

pytestmark = pytest.mark.bpf

JOB = """
import sys, time, threading
sys.setprofile(slice); threading.setprofile(slice)
import torch

def slow():
    time.sleep(0.05)

def train():
    model = torch.nn.Linear(8, 4)
    for _ in range(3):
        slow()
        model(torch.randn(2, 8)).sum().backward()

train()
torch.relu(torch.randn(4))  # in no traced function: a step of its own
print("ok", flush=True)
"""


def test_run_nests_torch_ops_under_the_python_calls_that_made_them(bpf_ready: None, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "receivers": {"python": {"min_duration": "10ms", "path_prefixes": [str(tmp_path) + "/"]}},
        "service": {"pipelines": {"default": {"receivers": ["python", "torch"], "processors": ["python", "torch"],
                                              "exporters": ["file"]}}}}))
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--config", str(config), "--output", str(out),
                          "--", sys.executable, str(job)], capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ok" in res.stdout
    rows = spans_from_jsonl(out / "traces.jsonl")
    py: dict[str, list[Any]] = collections.defaultdict(list)
    for _, scope, s in rows:
        if scope == "otel_ebpf.python":
            py[s.name].append(s)
    assert sorted(py) == ["job.slow", "job.train"]  # path_prefixes: nothing from torch's own code
    (train,) = py["job.train"]
    assert len(py["job.slow"]) == 3
    for s in py["job.slow"]:
        assert s.parent_span_id == train.span_id and s.trace_id == train.trace_id
        assert s.end_time_unix_nano - s.start_time_unix_nano >= 50_000_000
    ops = [s for _, scope, s in rows if scope == "otel_ebpf.torch"]
    by_id = {s.span_id: s for s in ops}
    addmm = [s for s in ops if s.name == "addmm"]
    assert len(addmm) == 3 and all(by_id[s.parent_span_id].name == "linear" for s in addmm)
    (relu,) = [s for s in ops if s.name == "relu"]
    inside = [s for s in ops if s is not relu and s.name != "pytorch.step"]
    assert inside and all(s.trace_id == train.trace_id for s in inside)  # one trace: job.train's
    top = [s for s in inside if s.name == "linear"]
    assert len(top) == 3 and all(s.parent_span_id == train.span_id for s in top)
    (step,) = [s for s in ops if s.name == "pytorch.step"]
    assert relu.parent_span_id == step.span_id and relu.trace_id == step.trace_id != train.trace_id
