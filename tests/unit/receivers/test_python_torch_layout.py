"""python.h / torch.h as gcc lays them out == their Python mirrors; decoding; configs as they
reach the programs; processors turning events into nested spans (ids derived, no buffering)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.events import MetricRecord, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.python import Config as PyProcConfig
from otel_ebpf.processors.python import PythonProcessor, qualified_name
from otel_ebpf.processors.torch import Config as TorchProcConfig
from otel_ebpf.processors.torch import TorchProcessor
from otel_ebpf.receivers import python as py_pkg
from otel_ebpf.receivers import torch as torch_pkg
from otel_ebpf.receivers.python import Config as PyConfig
from otel_ebpf.receivers.python.events import PythonCall
from otel_ebpf.receivers.python.receiver import CALL, PythonReceiver
from otel_ebpf.bpf.python_usdt import ArgSpec, UsdtSite, arg_macros
from otel_ebpf.receivers.torch import Config as TorchConfig
from otel_ebpf.receivers.torch.events import TorchOp
from otel_ebpf.receivers.torch.receiver import OP, TorchReceiver, op_symbol_regex

from tests.support.layout import assert_mirror, format_offsets, measure

CASES = [(CALL, Path(py_pkg.__file__).parent, "python.h", "PY_EV_CALL"),
         (OP, Path(torch_pkg.__file__).parent, "torch.h", "TORCH_EV_OP")]


@pytest.mark.parametrize(("mirror", "folder", "header", "macro"), CASES, ids=["python", "torch"])
def test_mirror_matches_c_layout(mirror: Any, folder: Path, header: str, macro: str, tmp_path: Path) -> None:
    c = measure(folder, header, tmp_path, structs={mirror.c_struct: mirror.fields}, values=[macro])
    assert_mirror(c, mirror.c_struct, mirror.fmt, mirror.fields)
    assert mirror.etype == c.values[macro]
    assert mirror.fields[0] == "type" and format_offsets(mirror.fmt)[0] == (0, 1)


def test_record_type_ranges() -> None:
    assert 112 <= CALL.etype <= 127 and 128 <= OP.etype <= 143


def test_python_decode_converts_times_and_cuts_strings() -> None:
    r = PythonReceiver(PyConfig(), Context(), ListConsumer())
    off = r.clock.offset_ns
    raw = CALL.fmt.pack(112, 7, 8, 2, 100, 200, 90, 80, 12, b"/app/train.py\0junk", b"step\0")
    assert r.decode(112, raw) == PythonCall(7, 8, "step", "/app/train.py", 12, 2, 100 + off, 200 + off, 90 + off,
                                            80 + off)
    raw = CALL.fmt.pack(112, 7, 8, 0, 100, 200, 0, 100, 1, b"x.py", b"f")
    assert r.decode(112, raw).parent_start == 0  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="unknown Python record"):
        r.decode(113, raw)


def test_usdt_arguments_become_c_expressions() -> None:
    args = (ArgSpec(8, "bp"), ArgSpec(8, "sp", 112), ArgSpec(-4, "ax"))
    sites = {n: UsdtSite("/x", n, 1, 2, args) for n in ("function__entry", "function__return")}
    flags = arg_macros(sites)
    assert "-DPY_ENTRY_FILE(ctx)=((u64)(ctx)->bp)" in flags
    assert "-DPY_RETURN_LINE(ctx)=((s32)(ctx)->ax)" in flags
    func = next(f for f in flags if f.startswith("-DPY_ENTRY_FUNC"))
    assert "bpf_probe_read_user" in func and "(ctx)->sp + (112)" in func


def test_python_config_reaches_the_program() -> None:
    cfg = build(PyConfig, {"min_duration": "20ms", "path_prefixes": ["/app/"], "max_depth": 64})
    r = PythonReceiver(cfg, Context(target_pids=[1]), ListConsumer())
    r.sites = {n: UsdtSite("/x", n, 1, 2, (ArgSpec(8, "bp"), ArgSpec(8, "r12"), ArgSpec(-4, "ax")))
               for n in ("function__entry", "function__return")}
    flags = r.program_cflags()
    for flag in ("-DPY_MIN_DURATION_NS=20000000", "-DPY_NUM_PREFIXES=1", "-DPY_MAX_DEPTH=64",
                 "-DPY_MAX_THREADS=4096", "-DOE_FILTER_PIDS=1"):
        assert flag in flags
    assert py_pkg.factory.type == "python" and not py_pkg.factory.default_on


@pytest.mark.parametrize(("cls", "data", "key"), [
    (PyConfig, {"max_depth": 48}, "receivers.python.max_depth"),
    (PyConfig, {"path_prefixes": ["x" * 128]}, "receivers.python.path_prefixes[0]"),
    (PyConfig, {"path_prefixes": ["/a"] * 9}, "receivers.python.path_prefixes"),
    (PyConfig, {"ringbuf_pages": 3}, "receivers.python.ringbuf_pages"),
    (PyConfig, {"bogus": 1}, "receivers.python.bogus"),
    (TorchConfig, {"ops": []}, "receivers.python.ops"),
    (TorchConfig, {"ops": ["addmm", "at::mm"]}, "receivers.python.ops[1]"),
    (TorchConfig, {"max_depth": 0}, "receivers.python.max_depth"),
])
def test_config_errors_name_the_key(cls: type, data: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        build(cls, data, "receivers.python")
    assert err.value.path == key


def test_op_symbol_regex_matches_only_the_call_entry_points() -> None:
    rx = re.compile(op_symbol_regex(["addmm", "add__Tensor"]))
    assert rx.match(b"_ZN2at4_ops5addmm4callERKNS_6TensorES4_S4_RKN3c106ScalarES8_")
    assert rx.match(b"_ZN2at4_ops11add__Tensor4callERNS_6TensorERKS2_RKN3c106ScalarE")
    assert not rx.match(b"_ZN2at4_ops5addmm4callERKNS_6TensorES4_S4_RKN3c106ScalarES8_.cold")
    assert not rx.match(b"_ZN2at4_ops13_sparse_addmm4callERKNS_6TensorE")
    assert not rx.match(b"_ZN2at4_ops5addmm10redispatchEN3c1014DispatchKeySetE")
    r = TorchReceiver(build(TorchConfig, {"min_duration": "1ms"}), Context(), ListConsumer())
    assert "-DTORCH_MIN_DURATION_NS=1000000" in r.program_cflags()
    assert '-DOE_LIB_PATTERN="libtorch_cpu.so"' in r.program_cflags()


def test_qualified_names() -> None:
    assert qualified_name("/app/train.py", "step") == "train.step"
    assert qualified_name("/x/pkg/__init__.py", "f") == "pkg.f"
    assert qualified_name("<frozen importlib._bootstrap>", "_find") == "_find"


def test_python_spans_nest_through_derived_ids() -> None:
    sink = ListConsumer()
    p = PythonProcessor(PyProcConfig(), Context(), sink)
    outer = PythonCall(5, 6, "outer", "/a/w.py", 3, 0, 1000, 9000, 0, 1000)
    inner = PythonCall(5, 6, "slow", "/a/w.py", 9, 1, 2000, 3000, 1000, 1000)
    p.consume([inner, "passed-through", outer])  # the child comes first: it returns first
    s_inner, other, s_outer = sink.events
    assert other == "passed-through"
    assert isinstance(s_inner, SpanRecord) and isinstance(s_outer, SpanRecord)
    assert s_inner.parent_span_id == s_outer.span_id and s_outer.parent_span_id is None
    assert s_inner.trace_id == s_outer.trace_id
    assert s_inner.name == "w.slow" and s_inner.attributes["code.function.name"] == "w.slow"
    assert s_inner.attributes["code.file.path"] == "/a/w.py" and s_inner.attributes["code.line.number"] == 9
    assert s_inner.attributes["thread.id"] == 6 and s_inner.scope == "otel_ebpf.python"
    other_thread = PythonCall(5, 7, "outer", "/a/w.py", 3, 0, 1000, 9000, 0, 1000)
    p.consume([other_thread])
    assert sink.events[-1].span_id != s_outer.span_id  # type: ignore[attr-defined]


def test_torch_ops_become_nested_spans_and_a_duration_histogram() -> None:
    sink = ListConsumer()
    p = TorchProcessor(TorchProcConfig(), Context(), sink)
    addmm = TorchOp(5, 6, "addmm", 1, 1100, 1900, 1000, 1000)
    linear = TorchOp(5, 6, "linear", 0, 1000, 2000, 0, 1000)
    p.consume([addmm, linear])
    metrics = [e for e in sink.events if isinstance(e, MetricRecord)]
    spans = [e for e in sink.events if isinstance(e, SpanRecord)]
    assert [m.value for m in metrics] == [800e-9, 1000e-9]
    assert metrics[0].name == "pytorch.op.duration" and metrics[0].attributes == {"pytorch.op.name": "addmm"}
    assert spans[0].parent_span_id == spans[1].span_id and spans[0].trace_id == spans[1].trace_id
    assert spans[0].attributes == {"pytorch.op.name": "addmm", "pytorch.op.depth": 1, "thread.id": 6}
    p2 = TorchProcessor(build(TorchProcConfig, {"spans": False}), Context(), sink := ListConsumer())
    p2.consume([addmm])
    assert [type(e) for e in sink.events] == [MetricRecord]


@pytest.mark.parametrize("proc", [PythonProcessor(PyProcConfig(), Context(), ListConsumer()),
                                  TorchProcessor(TorchProcConfig(), Context(), ListConsumer())])
def test_bad_events_are_counted_not_raised(proc: Any) -> None:
    bad_py = PythonCall(1, 1, "f", 5, 1, 0, 5, 6, 0, 0)  # type: ignore[arg-type]
    bad_torch = TorchOp(1, 1, "mm", 0, 5, "x", 0, 0)  # type: ignore[arg-type]
    proc.consume([bad_py, bad_torch])
    assert proc._telemetry.get("otel_ebpf.events.dropped") == 1  # the one its processor handles
