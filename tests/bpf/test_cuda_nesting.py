"""CUDA calls nested under the Python function that issued them, handed over in the kernel
(oe_thread_ctx, pinned on bpffs, shared by the python and cuda programs of one agent).

The workload is a Python script on /usr/bin/python3 (Debian's CPython, built --with-dtrace)
calling NVIDIA's REAL libcudart.so.12 through ctypes (no GPU here: the calls return 35, the
probes fire all the same). It sets a do-nothing C profile function first: CPython 3.11 to
3.14 fire python:function__entry only while one is set (gh-98894). Every wait is bounded.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.bpf import threadctx
from otel_ebpf.core.config import build
from otel_ebpf.core.events import ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.cuda import Config as CudaProcConfig
from otel_ebpf.processors.cuda import CudaProcessor
from otel_ebpf.processors.python import Config as PyProcConfig
from otel_ebpf.processors.python import PythonProcessor
from otel_ebpf.receivers.cuda import Config as CudaConfig
from otel_ebpf.receivers.cuda import CudaReceiver
from otel_ebpf.receivers.cuda.events import EnclosingCall, KernelLaunch, MemcpyCall
from otel_ebpf.receivers.python import Config as PyConfig
from otel_ebpf.receivers.python import PythonReceiver
from otel_ebpf.receivers.python.events import PythonCall

pytestmark = pytest.mark.bpf

PYTHON = "/usr/bin/python3"
WORKLOAD = """
import ctypes, sys, threading, time
cudart = ctypes.CDLL(sys.argv[1])

class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]

cudart.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
buf = ctypes.create_string_buffer(64)

def inner():
    time.sleep(0.005)
    cudart.cudaMemcpy(buf, buf, 2, 1)
    cudart.cudaLaunchKernel(ctypes.addressof(buf), Dim3(3, 1, 1), Dim3(32, 1, 1), None, 0, None)

def outer():
    time.sleep(0.005)
    cudart.cudaMemcpy(buf, buf, 1, 1)
    inner()
    cudart.cudaMemcpy(buf, buf, 3, 1)  # after inner returned: back to outer

sys.stdin.readline()
sys.setprofile(slice)  # CPython gh-98894: function__entry fires only with a profile function
threading.setprofile(slice)
outer()
cudart.cudaMemcpy(buf, buf, 4, 1)  # at module level: inside no traced function
print("done", flush=True)
"""


def _wait_for(what: str, cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def traced(script: Path, cudart: Path, *, with_python: bool) -> Iterator[tuple[Any, list[Any], ListConsumer]]:
    """The workload, traced by a cuda receiver (and a python one) sharing one Context."""
    proc = subprocess.Popen([PYTHON, str(script), str(cudart)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    receivers: list[Any] = []
    try:
        _wait_for("libcudart mapped", lambda: cudart.name in Path(f"/proc/{proc.pid}/maps").read_text())
        ctx, sink = Context(target_pids=[proc.pid]), ListConsumer()
        receivers.append(CudaReceiver(build(CudaConfig, {"launch_sample_every": 1}), ctx, sink))
        if with_python:
            cfg = build(PyConfig, {"min_duration": "1ms", "path_prefixes": [str(script.parent) + "/"]})
            receivers.append(PythonReceiver(cfg, ctx, sink))
        for r in receivers:
            r.start()
        yield proc, receivers, sink
    finally:
        for r in receivers:
            r.shutdown()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _run(proc: Any, sink: ListConsumer) -> None:
    out, _ = proc.communicate("go\n", timeout=60)
    assert out.startswith("done"), out
    _wait_for("the ProcessExit", lambda: any(isinstance(e, ProcessExit) for e in sink.events))


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "app" / "nest.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(WORKLOAD))
    return path


def test_cuda_calls_are_children_of_the_python_function_that_issued_them(
        bpf_ready: None, script: Path, cudart: Path) -> None:
    with traced(script, cudart, with_python=True) as (proc, receivers, sink):
        pin = receivers[0]._ctx_pin
        assert pin is not None and os.path.exists(pin) and receivers[1]._ctx_pin == pin  # one map, shared
        _run(proc, sink)
        _wait_for("python calls", lambda: len([e for e in sink.events if isinstance(e, PythonCall)]) >= 2)
        assert not list(receivers[0].bpf["oe_thread_ctx"].items())  # the thread's entry went with it
    assert not os.path.exists(pin)  # the last program of the agent removed the pin
    calls = {c.function: c for c in sink.events if isinstance(c, PythonCall)}
    outer, inner = calls["outer"], calls["inner"]
    copies = sorted((e for e in sink.events if isinstance(e, MemcpyCall)), key=lambda e: e.bytes)
    assert [c.bytes for c in copies] == [1, 2, 3, 4] and {c.rc for c in copies} == {35}
    for c, enclosing_fn in zip(copies[:3], (outer, inner, outer), strict=True):
        assert c.enclosing == EnclosingCall("python", enclosing_fn.start_ns, outer.start_ns), c
    assert copies[3].enclosing is None
    (launch,) = [e for e in sink.events if isinstance(e, KernelLaunch)]
    assert launch.enclosing == EnclosingCall("python", inner.start_ns, outer.start_ns)

    # through the processors: same trace as outer, parent = inner for the launch
    spans = ListConsumer()
    PythonProcessor(PyProcConfig(), Context(), CudaProcessor(CudaProcConfig(), Context(), spans)).consume(
        sink.events)
    by_name: dict[str, list[SpanRecord]] = {}
    for s in spans.events:
        if isinstance(s, SpanRecord):
            by_name.setdefault(s.name, []).append(s)
    (outer_span,) = by_name["nest.outer"]
    (inner_span,) = by_name["nest.inner"]
    assert inner_span.parent_span_id == outer_span.span_id and inner_span.trace_id == outer_span.trace_id
    (launch_span,) = by_name["cudaLaunchKernel"]
    assert launch_span.trace_id == outer_span.trace_id and launch_span.parent_span_id == inner_span.span_id
    memcpy_spans = sorted(by_name["cudaMemcpy"], key=lambda s: s.attributes["cuda.bytes"])
    assert all(s.trace_id == outer_span.trace_id for s in memcpy_spans[:3])
    assert [s.parent_span_id for s in memcpy_spans[:3]] == [outer_span.span_id, inner_span.span_id,
                                                            outer_span.span_id]
    assert memcpy_spans[3].trace_id is None and memcpy_spans[3].parent_span_id is None


def test_cuda_alone_reads_no_call_slots(bpf_ready: None, script: Path, cudart: Path) -> None:
    """Without a python/torch receiver nothing writes the per-thread call slots: the cuda program keeps only
    its stream captures in the shared map (for the nccl program), reads no call slot (no lookup per call), and
    its calls have no enclosing call."""
    with traced(script, cudart, with_python=False) as (proc, receivers, sink):
        (cuda,) = receivers
        assert cuda.thread_context and cuda._ctx_pin is not None
        flags = cuda.program_cflags()
        assert "-DOE_THREAD_CTX=1" in flags and "-DCUDA_CALL_CONTEXT=0" in flags and "-DCUDA_LAUNCH_CONTEXT=0" in flags
        _run(proc, sink)
    copies = [e for e in sink.events if isinstance(e, MemcpyCall)]
    assert len(copies) == 4 and all(c.enclosing is None for c in copies)


def test_stale_pins_of_dead_agents_are_removed(bpf_ready: None) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    stale = threadctx.BPFFS / f"otel-ebpf-{dead.pid}"
    stale.mkdir(exist_ok=True)
    ctx = Context()
    path = threadctx.acquire(ctx)
    try:
        assert path is not None and not stale.exists()
        assert str(os.getpid()) in path
    finally:
        threadctx.release(path)
    assert not os.path.exists(os.path.dirname(path))


TORCH_WORKLOAD = """
import ctypes, sys, warnings
import torch
cudart = ctypes.CDLL(sys.argv[1])

class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]

cudart.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
buf = ctypes.create_string_buffer(64)

def mm_on_cpu(a, b):
    # stands for a CUDA kernel: the CPU kernel of aten::mm, called inside at::_ops::mm::call
    cudart.cudaMemcpy(buf, buf, 7, 1)
    cudart.cudaLaunchKernel(ctypes.addressof(buf), Dim3(4, 1, 1), Dim3(64, 1, 1), None, 0, None)
    return (a.unsqueeze(2) * b.unsqueeze(0)).sum(1)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("mm", mm_on_cpu, "CPU")
print("ready", flush=True)
sys.stdin.readline()
torch.mm(torch.ones(2, 3), torch.ones(3, 4))
cudart.cudaMemcpy(buf, buf, 8, 1)  # outside any operator
print("done", flush=True)
"""


def test_cuda_work_inside_a_pytorch_operator_nests_under_it_and_counts_per_operator(
        bpf_ready: None, tmp_path: Path, cudart: Path) -> None:
    """aten::mm's CPU kernel replaced by a Python function (torch.library) that calls the real
    libcudart: the CUDA calls run inside at::_ops::mm::call, as a GPU kernel's launch would."""
    import sys

    pytest.importorskip("torch", reason="torch (CPU) is a test dependency")
    from otel_ebpf.core.ids import TORCH_ROOT_STEP
    from otel_ebpf.processors.torch import Config as TorchProcConfig
    from otel_ebpf.processors.torch import TorchProcessor
    from otel_ebpf.receivers.cuda.events import KernelLaunchStats
    from otel_ebpf.receivers.torch import Config as TorchConfig
    from otel_ebpf.receivers.torch.events import TorchOp
    from otel_ebpf.receivers.torch.receiver import TorchReceiver

    script = tmp_path / "torch_nest.py"
    script.write_text(textwrap.dedent(TORCH_WORKLOAD))
    proc = subprocess.Popen([sys.executable, str(script), str(cudart)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    ctx, sink = Context(target_pids=[proc.pid]), ListConsumer()
    cuda = CudaReceiver(build(CudaConfig, {"launch_sample_every": 1}), ctx, sink)
    torch_r = TorchReceiver(build(TorchConfig, {"ops": ["mm"]}), ctx, sink)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        cuda.start()
        torch_r.start()
        out, _ = proc.communicate("go\n", timeout=120)
        assert out.startswith("done"), out
        _wait_for("the ProcessExit", lambda: any(isinstance(e, ProcessExit) for e in sink.events))
        cuda.shutdown()  # the last read of the launch counters, while the torch receiver still names ops
    finally:
        cuda.shutdown()
        torch_r.shutdown()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    (mm,) = [e for e in sink.events if isinstance(e, TorchOp) and e.pid == proc.pid]
    inside, outside = sorted((e for e in sink.events if isinstance(e, MemcpyCall)), key=lambda e: e.bytes)
    # mm is a top-level call outside any traced Python call: the first (and only) call of its thread's step,
    # so its root is the step's start (mm's own) tagged as a step (receivers/torch: "Traces and steps")
    step_root = mm.start_ns | TORCH_ROOT_STEP
    assert inside.enclosing == EnclosingCall("torch", mm.start_ns, step_root)
    assert outside.enclosing is None
    (launch,) = [e for e in sink.events if isinstance(e, KernelLaunch)]
    assert launch.enclosing == EnclosingCall("torch", mm.start_ns, step_root)
    stats = [e for e in sink.events if isinstance(e, KernelLaunchStats)]
    assert [(s.count, s.op) for s in stats] == [(1, "mm")]

    spans = ListConsumer()
    TorchProcessor(TorchProcConfig(), Context(), CudaProcessor(CudaProcConfig(), Context(), spans)).consume(
        sink.events)
    by_name: dict[str, list[SpanRecord]] = {}
    for s in spans.events:
        if isinstance(s, SpanRecord):
            by_name.setdefault(s.name, []).append(s)
    (mm_span,) = by_name["mm"]
    copy_span = min(by_name["cudaMemcpy"], key=lambda s: s.attributes["cuda.bytes"])
    assert (copy_span.trace_id, copy_span.parent_span_id) == (mm_span.trace_id, mm_span.span_id)
    (launch_span,) = by_name["cudaLaunchKernel"]
    assert launch_span.parent_span_id == mm_span.span_id
    counts = [m for m in spans.events if getattr(m, "name", "") == "gpu.cuda.kernel.launch.calls"]
    assert [m.attributes.get("pytorch.op.name") for m in counts] == ["mm"]
