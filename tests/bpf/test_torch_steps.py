"""One trace per training step (issue 18): real CPU training loops (torch 2.13 CPU, a test
dependency) traced by the real torch receiver (operator uprobes and the record_function step
markers on libtorch_cpu.so), their events turned into spans by the torch (and python) processors.

* With an optimizer (SGD, Adam): one trace per step, rooted at a ``pytorch.step`` span that
  Optimizer.step#... ended, holding that step's operator calls; not one trace per operator call.
* Without one: steps split by the idle gap between them; under ``torch.profiler``, by its
  ProfilerStep#... scopes.
* Inside a traced Python function (python receiver): the calls nest under it, in its trace.

The process waits on stdin before ``import torch``, so libtorch_cpu.so is caught when opened.
Every wait is bounded; a stall of the loaded machine inside a step longer than the gap threshold
would split a step (the gap tests leave a wide margin).
"""
from __future__ import annotations

import collections
import itertools
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.events import ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.python import Config as PyProcConfig
from otel_ebpf.processors.python import PythonProcessor
from otel_ebpf.processors.torch import Config as ProcConfig
from otel_ebpf.processors.torch import TorchProcessor
from otel_ebpf.receivers.python import Config as PyConfig
from otel_ebpf.receivers.python import PythonReceiver
from otel_ebpf.receivers.python.events import PythonCall
from otel_ebpf.receivers.torch import Config, TorchReceiver
from otel_ebpf.receivers.torch.events import TorchOp, TorchStep

pytestmark = pytest.mark.bpf

STEPS = 10
HEAD = """
import sys, threading, time
sys.stdin.readline()
import torch
if "--profile-hook" in sys.argv:  # CPython gh-98894: function__entry fires only with a profile function
    sys.setprofile(slice)
    threading.setprofile(slice)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
x, y = torch.randn(64, 16), torch.randn(64, 1)
"""
OPTIMIZER_LOOP = HEAD + f"""
opt = getattr(torch.optim, sys.argv[1])(model.parameters(), lr=0.01)
for _ in range({STEPS}):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print("done", flush=True)
"""
GAP_LOOP = HEAD + f"""
for _ in range({STEPS}):
    torch.nn.functional.mse_loss(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad  # sub_: not a probed operator
            p.grad = None
    time.sleep(0.3)  # e.g. waiting for data
print("done", flush=True)
"""
PROFILER_LOOP = HEAD + """
from torch.profiler import ProfilerActivity, profile, schedule
# with a schedule, torch.profiler opens a ProfilerStep#<n> scope at each step()
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2)) as prof:
    for _ in range(6):
        torch.nn.functional.mse_loss(model(x), y).backward()
        prof.step()
print("done", flush=True)
"""
PYTHON_LOOP = HEAD + """
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def train_step():
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()

def train():
    for _ in range(3):
        train_step()

train()
print("done", flush=True)
"""
# per step of the 2-layer MLP: forward linear x2 (addmm under each), relu, mse_loss; backward
# mse_loss_backward, threshold_backward, mm for the weight/input gradients
STEP_OPS = {"linear": 2, "relu": 1, "mse_loss": 1, "mse_loss_backward": 1, "threshold_backward": 1}


def _wait_for(what: str, cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def trace(tmp_path: Path, program: str, args: list[str], torch_cfg: dict[str, Any] | None = None,
          python: bool = False, steps: int = 0) -> tuple[Context, list[object]]:
    """Run ``program`` traced by a torch receiver (and a python one, for calls in ``program``'s
    file); returns the receivers' context and the spans the processors make of the events, then
    the events."""
    script = tmp_path / "app" / "loop.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(program)
    proc = subprocess.Popen([sys.executable, str(script), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    ctx, sink = Context(target_pids=[proc.pid]), ListConsumer()
    receivers: list[Any] = [TorchReceiver(build(Config, torch_cfg or {}), ctx, sink)]
    if python:
        cfg = build(PyConfig, {"min_duration": "0s", "path_prefixes": [str(script.parent) + "/"]})
        receivers.append(PythonReceiver(cfg, ctx, sink))
    try:
        for r in receivers:
            r.start()
        out, _ = proc.communicate("go\n", timeout=240)
        assert out.strip() == "done"
        _wait_for("the ProcessExit", lambda: any(isinstance(e, ProcessExit) for e in sink.events))
        _wait_for(f"{steps} steps", lambda: sum(isinstance(e, TorchStep) for e in sink.events) >= steps)
        assert ctx.telemetry.get("otel_ebpf.events.dropped", receiver="torch") == 0, ctx.telemetry.snapshot()
    finally:
        for r in receivers:
            r.shutdown()
        if proc.poll() is None:
            proc.kill()
    spans = ListConsumer()
    chain = TorchProcessor(ProcConfig(), Context(), PythonProcessor(PyProcConfig(), Context(), spans))
    chain.consume(sink.events)
    chain.shutdown()
    return ctx, [e for e in spans.events if isinstance(e, SpanRecord)] + [
        e for e in sink.events if isinstance(e, (TorchOp, TorchStep, PythonCall))]


def by_trace(spans: list[SpanRecord]) -> dict[int, list[SpanRecord]]:
    out: dict[int, list[SpanRecord]] = collections.defaultdict(list)
    for s in spans:
        out[s.trace_id].append(s)
    return out


def assert_step_traces(spans: list[SpanRecord], n: int, reason: str) -> list[SpanRecord]:
    """``n`` traces, each one pytorch.step root ended by ``reason`` holding one step's calls: its
    top-level calls are the root's children, within its time, the rest nest under them."""
    traces = by_trace(spans)
    assert len(traces) == n, collections.Counter(s.name for s in spans if s.name == "pytorch.step")
    roots = []
    for members in traces.values():
        (root,) = [s for s in members if s.name == "pytorch.step"]
        assert root.parent_span_id is None and root.attributes["pytorch.step.end_reason"] == reason
        ids = {s.span_id: s for s in members}
        top = [s for s in members if s.parent_span_id == root.span_id]
        assert len(top) == root.attributes["pytorch.step.ops"]
        for s in members:
            if s is not root:
                assert s.parent_span_id in ids  # nested within the trace, no orphan
            assert root.start_ns <= s.start_ns and s.end_ns <= root.end_ns
        names = collections.Counter(s.name for s in top)
        assert all(names[op] == k for op, k in STEP_OPS.items()), names
        roots.append(root)
    roots.sort(key=lambda r: r.start_ns)
    assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(roots))
    return roots


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_a_training_loop_is_one_trace_per_step_rooted_at_pytorch_step(
        bpf_ready: None, tmp_path: Path, optimizer: str) -> None:
    pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    _, records = trace(tmp_path, OPTIMIZER_LOOP, [optimizer], steps=STEPS)
    spans = [e for e in records if isinstance(e, SpanRecord)]
    ops = [e for e in records if isinstance(e, TorchOp)]
    assert len(ops) > 10 * STEPS  # over a hundred operator calls...
    roots = assert_step_traces(spans, STEPS, "optimizer")  # ...in one trace per step
    assert [r.attributes["pytorch.step.seq"] for r in roots] == list(range(1, STEPS + 1))
    if optimizer == "SGD":  # its update: one add_ per parameter, inside the step's trace
        for members in by_trace(spans).values():
            assert sum(s.name == "add__Tensor" for s in members) == 4


def test_without_an_optimizer_steps_are_split_by_the_gap_between_them(bpf_ready: None, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    _, records = trace(tmp_path, GAP_LOOP, [], {"step_gap": "100ms"}, steps=STEPS)
    spans = [e for e in records if isinstance(e, SpanRecord)]
    traces = by_trace(spans)
    assert len(traces) == STEPS
    reasons = collections.Counter(s.attributes["pytorch.step.end_reason"] for s in spans if s.name == "pytorch.step")
    assert reasons == {"gap": STEPS - 1, "thread_exit": 1}  # the last step ends with the thread
    for members in traces.values():
        (root,) = [s for s in members if s.name == "pytorch.step"]
        top = collections.Counter(s.name for s in members if s.parent_span_id == root.span_id)
        assert all(top[op] == k for op, k in STEP_OPS.items()), top


def test_bounds_cut_a_long_step_and_count_it(bpf_ready: None, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    ctx, records = trace(tmp_path, OPTIMIZER_LOOP, ["SGD"], {"step_max_ops": 4}, steps=STEPS)
    steps = [e for e in records if isinstance(e, TorchStep)]
    cut = [s for s in steps if s.reason == "max_ops"]
    # each training step (13 top-level calls here) is cut every 4 calls; its rest ends at Optimizer.step
    assert [s.reason for s in steps].count("optimizer") == STEPS and len(cut) >= 2 * STEPS
    assert all(s.ops == 4 for s in cut) and all(0 < s.ops <= 4 for s in steps)
    assert ctx.telemetry.get("otel_ebpf.torch.steps_cut", reason="max_ops") == len(cut)
    top = [e for e in records if isinstance(e, TorchOp) and e.depth == 0]
    assert sum(s.ops for s in steps) == len(top)


def test_under_torch_profiler_its_step_scopes_split_the_steps(bpf_ready: None, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    _, records = trace(tmp_path, PROFILER_LOOP, [], steps=6)
    spans = [e for e in records if isinstance(e, SpanRecord)]
    assert_step_traces(spans, 6, "profiler_step")


def test_calls_inside_a_traced_python_function_nest_under_it(bpf_ready: None, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    _, records = trace(tmp_path, PYTHON_LOOP, ["--profile-hook"], python=True)
    spans = [e for e in records if isinstance(e, SpanRecord)]
    py = {s.span_id: s for s in spans if s.scope == "otel_ebpf.python"}
    (train,) = [s for s in py.values() if s.name == "loop.train"]
    steps = [s for s in py.values() if s.name == "loop.train_step"]
    assert len(steps) == 3 and all(s.parent_span_id == train.span_id for s in steps)
    ops = [s for s in spans if s.scope == "otel_ebpf.torch"]
    assert not [s for s in ops if s.name == "pytorch.step"]  # every call was inside a traced function
    top = [s for s in ops if s.attributes["pytorch.op.depth"] == 0]
    assert len(top) >= 3 * sum(STEP_OPS.values())
    ids = {s.span_id: s for s in spans}
    for s in ops:
        assert s.trace_id == train.trace_id
        assert s.parent_span_id in ids
    for s in top:
        parent = ids[s.parent_span_id]
        assert parent.name == "loop.train_step" and parent.start_ns <= s.start_ns and s.end_ns <= parent.end_ns
