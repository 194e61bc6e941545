"""The torch processor's traces: a step's top-level operator calls (root tagged TORCH_ROOT_STEP) and
the calls and CUDA calls under them share the trace of its ``pytorch.step`` span; calls made inside a
traced Python call (root tagged TORCH_ROOT_PYTHON) share that call's trace, under it; a step whose
end never came gets its span at shutdown."""
from __future__ import annotations

from otel_ebpf.core.config import build
from otel_ebpf.core.events import MetricRecord, SpanRecord
from otel_ebpf.core.ids import TORCH_ROOT_PYTHON, TORCH_ROOT_STEP, call_ids, op_ids, step_ids
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.cuda import Config as CudaConfig
from otel_ebpf.processors.cuda import CudaProcessor
from otel_ebpf.processors.python import Config as PyConfig
from otel_ebpf.processors.python import PythonProcessor
from otel_ebpf.processors.torch import Config, TorchProcessor
from otel_ebpf.processors.torch.processor import MAX_OPEN_STEPS
from otel_ebpf.receivers.cuda.events import EnclosingCall, MemcpyCall
from otel_ebpf.receivers.python.events import PythonCall
from otel_ebpf.receivers.torch.events import TorchOp, TorchStep

PID, TID = 40, 41
T = 1_700_000_000_000_000_000


def spans(events: list[object]) -> list[SpanRecord]:
    return [e for e in events if isinstance(e, SpanRecord)]


def step_ops(step: int, n: int, tid: int = TID) -> list[TorchOp]:
    """n top-level linear calls of the step that began at ``step``, each with an addmm under it
    (children first: they return first)."""
    root = step | TORCH_ROOT_STEP
    out = []
    for i in range(n):
        s = step + i * 1000
        out += [TorchOp(PID, tid, "addmm", 1, s + 10, s + 500, s, root),
                TorchOp(PID, tid, "linear", 0, s, s + 600, step, root)]
    return out


def test_each_step_is_one_trace_rooted_at_its_pytorch_step_span() -> None:
    sink = ListConsumer()
    p = TorchProcessor(Config(), Context(), sink)
    s1, s2 = T, T + 1_000_000
    p.consume([*step_ops(s1, 3), TorchStep(PID, TID, s1, s1 + 2600, 3, 1, "optimizer"),
               *step_ops(s2, 2), TorchStep(PID, TID, s2, s2 + 1600, 2, 2, "gap")])
    out = spans(sink.events)
    roots = [s for s in out if s.name == "pytorch.step"]
    assert len(roots) == 2 and len({s.trace_id for s in out}) == 2
    for root, start, n in zip(roots, (s1, s2), (3, 2), strict=True):
        assert (root.trace_id, root.span_id) == step_ids(PID, TID, start) and root.parent_span_id is None
        assert root.start_ns == start and root.attributes["pytorch.step.ops"] == n
        members = [s for s in out if s.trace_id == root.trace_id and s is not root]
        assert len(members) == 2 * n
        by_id = {s.span_id: s for s in members}
        for s in members:
            if s.name == "linear":
                assert s.parent_span_id == root.span_id
            else:
                assert by_id[s.parent_span_id].name == "linear"
    assert [r.attributes["pytorch.step.end_reason"] for r in roots] == ["optimizer", "gap"]
    assert [r.attributes["pytorch.step.seq"] for r in roots] == [1, 2]
    durations = [m for m in sink.events if isinstance(m, MetricRecord) and m.name == "pytorch.step.duration"]
    assert [(m.value, m.attributes) for m in durations] == [(2600e-9, {"pytorch.step.end_reason": "optimizer"}),
                                                             (1600e-9, {"pytorch.step.end_reason": "gap"})]
    p.shutdown()
    assert len(spans(sink.events)) == len(out)  # both ended: nothing more at shutdown


def test_a_cuda_call_under_a_step_s_operator_joins_the_step_trace() -> None:
    out = ListConsumer()
    chain = TorchProcessor(Config(), Context(), CudaProcessor(CudaConfig(), Context(), out))
    addmm, linear = step_ops(T, 1)
    copy = MemcpyCall(PID, TID, "cudaMemcpyAsync", 1, T + 20, T + 30, 0, 0x1000, 0x2000, 64, 0xABC, 1,
                      enclosing=EnclosingCall("torch", addmm.start_ns, T | TORCH_ROOT_STEP))
    chain.consume([copy, addmm, linear, TorchStep(PID, TID, T, T + 600, 1, 1, "optimizer")])
    by_name = {s.name: s for s in spans(out.events)}
    assert by_name["cudaMemcpyAsync"].parent_span_id == by_name["addmm"].span_id
    assert by_name["cudaMemcpyAsync"].trace_id == by_name["pytorch.step"].trace_id == by_name["linear"].trace_id


def test_calls_inside_a_traced_python_call_nest_under_it_in_its_trace() -> None:
    sink = ListConsumer()
    py = PythonProcessor(PyConfig(), Context(), sink)
    torch = TorchProcessor(Config(), Context(), sink)
    train = PythonCall(PID, TID, "train", "/a/t.py", 1, 0, T, T + 10_000, 0, T)
    step = PythonCall(PID, TID, "step", "/a/t.py", 5, 1, T + 100, T + 9000, T, T)
    root = T | TORCH_ROOT_PYTHON  # the Python root's start, tagged
    addmm = TorchOp(PID, TID, "addmm", 1, T + 210, T + 800, T + 200, root)
    linear = TorchOp(PID, TID, "linear", 0, T + 200, T + 900, T + 100, root)  # parent: the innermost call
    torch.consume([addmm, linear])
    py.consume([step, train])
    by_name = {s.name: s for s in spans(sink.events)}
    assert by_name["linear"].parent_span_id == by_name["t.step"].span_id == call_ids(PID, TID, T + 100, T)[1]
    assert by_name["addmm"].parent_span_id == by_name["linear"].span_id
    assert len({s.trace_id for s in by_name.values()}) == 1
    assert "pytorch.step" not in by_name
    torch.shutdown()
    assert "pytorch.step" not in {s.name for s in spans(sink.events)}


def test_untagged_roots_keep_one_trace_per_top_level_call() -> None:
    sink = ListConsumer()
    p = TorchProcessor(build(Config, {}), Context(), sink)
    a = TorchOp(PID, TID, "linear", 0, T, T + 10, 0, T)
    b = TorchOp(PID, TID, "linear", 0, T + 20, T + 30, 0, T + 20)
    p.consume([a, b])
    x, y = spans(sink.events)
    assert x.trace_id != y.trace_id and x.parent_span_id is None and y.parent_span_id is None
    assert (x.trace_id, x.span_id) == op_ids(PID, TID, T, T)


def test_a_step_that_never_ended_gets_its_span_at_shutdown_from_the_calls_seen() -> None:
    sink = ListConsumer()
    p = TorchProcessor(Config(), Context(), sink)
    done, open_ = T, T + 1_000_000
    p.consume([*step_ops(done, 2), TorchStep(PID, TID, done, done + 1600, 2, 1, "gap"), *step_ops(open_, 3),
               *step_ops(T, 1, tid=TID + 1)])
    assert [s.name for s in spans(sink.events)].count("pytorch.step") == 1
    p.shutdown()
    p.shutdown()  # safe twice
    roots = [s for s in spans(sink.events) if s.name == "pytorch.step"]
    assert len(roots) == 3
    late = {r.attributes["thread.id"]: r for r in roots[1:]}
    assert late[TID].start_ns == open_ and late[TID].end_ns == open_ + 2600
    assert late[TID].attributes["pytorch.step.ops"] == 3 and late[TID].attributes["pytorch.step.end_reason"] == "open"
    assert (late[TID].trace_id, late[TID].span_id) == step_ids(PID, TID, open_)
    assert "pytorch.step.seq" not in late[TID].attributes and late[TID + 1].start_ns == T


def test_a_late_call_of_an_ended_step_does_not_reopen_it_and_open_steps_are_bounded() -> None:
    sink = ListConsumer()
    p = TorchProcessor(Config(), Context(), sink)
    first, late = step_ops(T, 2)[:2], step_ops(T, 2)[2:]
    p.consume([*first, TorchStep(PID, TID, T, T + 600, 2, 1, "optimizer"), *late])
    p.shutdown()
    assert [s.name for s in spans(sink.events)].count("pytorch.step") == 1
    sink = ListConsumer()
    p = TorchProcessor(Config(), Context(), sink)
    p.consume([TorchOp(PID, tid, "relu", 0, T, T + 5, T, T | TORCH_ROOT_STEP) for tid in range(MAX_OPEN_STEPS + 2)])
    evicted = [s for s in spans(sink.events) if s.name == "pytorch.step"]
    assert [s.attributes["thread.id"] for s in evicted] == [0, 1]  # the oldest, ended so
    p.shutdown()
    assert [s.name for s in spans(sink.events)].count("pytorch.step") == MAX_OPEN_STEPS + 2


def test_without_spans_only_the_step_duration_is_kept() -> None:
    sink = ListConsumer()
    p = TorchProcessor(build(Config, {"spans": False}), Context(), sink)
    p.consume([*step_ops(T, 1), TorchStep(PID, TID, T, T + 600, 1, 1, "max_ops")])
    p.shutdown()
    assert not spans(sink.events)
    assert [m.name for m in sink.events if isinstance(m, MetricRecord)] == ["pytorch.op.duration"] * 2 + [
        "pytorch.step.duration"]
