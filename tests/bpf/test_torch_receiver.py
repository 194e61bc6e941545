"""The PyTorch receiver's real uprobes on the real libtorch_cpu.so (torch 2.13 CPU, a test
dependency), in a small training loop: Linear(16, 32) -> ReLU -> Linear(32, 1), MSE loss,
SGD, 20 steps. The process is started before ``import torch``, so the library is caught when
it is opened (held until the probes are attached). Every wait is bounded.
"""
from __future__ import annotations

import collections
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.events import LibraryLoaded, ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.torch import Config as ProcessorConfig
from otel_ebpf.processors.torch import TorchProcessor
from otel_ebpf.receivers.torch import DEFAULT_OPS, Config, create
from otel_ebpf.receivers.torch.events import TorchOp

pytestmark = pytest.mark.bpf

STEPS = 20
LOOP = f"""
import sys
sys.stdin.readline()
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 16), torch.randn(64, 1)
for _ in range({STEPS}):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
print("done", flush=True)
"""


def _wait_for(what: str, cond: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def traced_loop(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[object], dict[str, int]]:
    pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    script = tmp_path_factory.mktemp("torch_loop") / "loop.py"
    script.write_text(LOOP)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    sink = ListConsumer()
    receiver = create(build(Config, {}), Context(target_pids=[proc.pid]), sink)
    try:
        receiver.start()
        out, _ = proc.communicate("go\n", timeout=180)
        assert out.strip() == "done"
        _wait_for("the ProcessExit", lambda: any(isinstance(e, ProcessExit) for e in sink.events))
        telemetry = {"attached": receiver.ctx.telemetry.get("otel_ebpf.probes.attached"),
                     "failed": receiver.ctx.telemetry.get("otel_ebpf.probes.failed"),
                     "dropped": receiver.ctx.telemetry.get("otel_ebpf.events.dropped")}
    finally:
        receiver.shutdown()
        if proc.poll() is None:
            proc.kill()
    return proc.pid, list(sink.events), telemetry


def test_libtorch_is_caught_when_opened_and_every_default_op_is_probed(
        bpf_ready: None, traced_loop: tuple[int, list[object], dict[str, int]]) -> None:
    pid, events, telemetry = traced_loop
    loaded = [e for e in events if isinstance(e, LibraryLoaded)]
    assert loaded and loaded[0].pid == pid and Path(loaded[0].path).name == "libtorch_cpu.so"
    # uprobe + uretprobe, each op found once; the step markers: record_function_enter_new's
    # uprobe + uretprobe, record_function_exit_new's uprobe
    assert telemetry["attached"] == 2 * len(DEFAULT_OPS) + 3
    assert telemetry["failed"] == 0 and telemetry["dropped"] == 0


def test_the_loop_s_operators_appear_with_counts_matching_the_loop(
        bpf_ready: None, traced_loop: tuple[int, list[object], dict[str, int]]) -> None:
    pid, events, _ = traced_loop
    ops = [e for e in events if isinstance(e, TorchOp)]
    assert {e.pid for e in ops} == {pid}
    counts = collections.Counter(e.op for e in ops)
    # forward: 2 Linear layers (linear -> addmm), 1 ReLU, 1 MSE per step
    assert counts["linear"] == 2 * STEPS and counts["addmm"] == 2 * STEPS
    assert counts["relu"] == STEPS and counts["mse_loss"] == STEPS
    # backward: mse_loss_backward, ReLU's threshold_backward, weight/input gradients through mm
    assert counts["mse_loss_backward"] == STEPS and counts["threshold_backward"] == STEPS
    assert counts["mm"] >= 2 * STEPS
    # SGD: one in-place add_ per parameter (2 weights, 2 biases) per step
    assert counts["add__Tensor"] == 4 * STEPS
    for e in ops:
        assert 0 < e.end_ns - e.start_ns < 5e9


def test_ops_called_by_ops_nest_under_them(bpf_ready: None,
                                           traced_loop: tuple[int, list[object], dict[str, int]]) -> None:
    _, events, _ = traced_loop
    ops = [e for e in events if isinstance(e, TorchOp)]
    by_start = {(e.tid, e.start_ns): e for e in ops}
    addmm = [e for e in ops if e.op == "addmm"]
    for e in addmm:
        parent = by_start[(e.tid, e.parent_start)]
        assert parent.op == "linear" and parent.depth == e.depth - 1
        assert parent.start_ns <= e.start_ns and e.end_ns <= parent.end_ns
    sink = ListConsumer()
    TorchProcessor(ProcessorConfig(), Context(), sink).consume(ops)
    spans = {(s.attributes["thread.id"], s.start_ns): s for s in sink.events if isinstance(s, SpanRecord)}
    for e in addmm:
        child, parent = spans[(e.tid, e.start_ns)], spans[(e.tid, e.parent_start)]
        assert child.parent_span_id == parent.span_id and child.trace_id == parent.trace_id
        assert child.name == "addmm" and child.attributes["pytorch.op.name"] == "addmm"
