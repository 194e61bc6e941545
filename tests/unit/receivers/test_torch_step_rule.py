"""The torch receiver's step rule (receivers/torch/torch_steps.h, the code torch.bpf.c runs at each
top-level operator call), built with gcc and driven call by call: the gap rule, its absence on a
thread that showed a step marker, and the duration and count bounds. Also torch.h's step record,
root tags and marker words against their Python mirrors, and decoding."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.ids import TORCH_ROOT_PYTHON, TORCH_ROOT_STEP
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.receivers import torch as torch_pkg
from otel_ebpf.receivers.torch import Config
from otel_ebpf.receivers.torch.events import STEP_END_REASONS, TorchOp, TorchStep
from otel_ebpf.receivers.torch.receiver import MARKER_REGEX, OP, STEP, TorchReceiver

from tests.support.layout import SHIM, assert_mirror, measure

FOLDER = Path(torch_pkg.__file__).parent
MS = 1_000_000

# Reads "call ENTRY RETURN" / "mark" lines; does per call what torch_top_level does (end the due
# step, add the call) and at its return what torch_op_return does; prints each ended step as
# "START LAST OPS SEQ REASON", and the step still open at the end with reason 0.
HARNESS = r"""
#include <stdio.h>
#include <string.h>
#ifndef __always_inline
#define __always_inline inline
#endif
%s
#include "torch.h"
#define TORCH_STEP_GAP_NS %dULL
#define TORCH_STEP_MAX_NS %dULL
#define TORCH_STEP_MAX_OPS %d
#include "torch_steps.h"

static void end(struct torch_step_state *st, int reason)
{
    printf("%%llu %%llu %%u %%llu %%d\n", st->start, st->last, st->ops, st->seq, reason);
    st->start = 0;
}

int main(void)
{
    struct torch_step_state st;
    memset(&st, 0, sizeof(st));
    char what[8];
    unsigned long long in, out;
    while (scanf("%%7s", what) == 1) {
        if (!strcmp(what, "mark")) {
            st.marked = 1;
            continue;
        }
        if (scanf("%%llu %%llu", &in, &out) != 2)
            return 2;
        u8 reason = torch_step_due(&st, in);
        if (reason)
            end(&st, reason);
        torch_step_add(&st, in);
        st.last = out;
    }
    if (st.start)
        end(&st, 0);
    return 0;
}
"""


def run_rule(tmp_path: Path, script: str, gap: int = 10 * MS, max_ns: int = 10_000 * MS,
             max_ops: int = 10_000) -> list[tuple[int, int, int, int, str]]:
    """(start, last return, calls, seq, end reason) of each step ``script`` makes ('open': still open)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is needed to build the step rule")
    src, exe = tmp_path / "rule.c", tmp_path / "rule"
    src.write_text(HARNESS % (SHIM, gap, max_ns, max_ops))
    built = subprocess.run([gcc, "-Wall", "-Werror", f"-I{FOLDER}", "-o", str(exe), str(src)],
                           capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    res = subprocess.run([str(exe)], input=script, capture_output=True, text=True, timeout=10, check=True)
    steps = []
    for line in res.stdout.splitlines():
        start, last, ops, seq, reason = (int(x) for x in line.split())
        steps.append((start, last, ops, seq, STEP_END_REASONS[reason] if reason else "open"))
    return steps


def calls(*spans: tuple[float, float]) -> str:
    return "".join(f"call {int(a * MS)} {int(b * MS)}\n" for a, b in spans)


def test_a_gap_longer_than_the_threshold_starts_a_new_step(tmp_path: Path) -> None:
    # two bursts of three calls 1 ms apart, 50 ms between them; 10 ms threshold
    script = calls((1, 2), (3, 4), (5, 6), (56, 57), (58, 59), (60, 61))
    assert run_rule(tmp_path, script) == [(1 * MS, 6 * MS, 3, 1, "gap"), (56 * MS, 61 * MS, 3, 2, "open")]


def test_the_gap_is_measured_from_the_last_return_not_the_last_entry(tmp_path: Path) -> None:
    # a 30 ms call, then one 5 ms after its return: same step (entries are 35 ms apart)
    assert run_rule(tmp_path, calls((1, 31), (36, 37))) == [(1 * MS, 37 * MS, 2, 1, "open")]
    # exactly at the threshold: not past it, same step
    assert run_rule(tmp_path, calls((1, 2), (12, 13)))[0][2] == 2


def test_a_thread_that_showed_a_marker_has_no_gap_rule(tmp_path: Path) -> None:
    script = "mark\n" + calls((1, 2), (500, 501), (900, 901))
    assert run_rule(tmp_path, script) == [(1 * MS, 901 * MS, 3, 1, "open")]


def test_a_step_open_too_long_ends_at_its_next_call_and_then_by_the_count(tmp_path: Path) -> None:
    # calls every 1 ms (no gap), 4.5 ms longest step: the call entering 5 ms after the step began ends it
    script = calls(*((t, t + 0.5) for t in range(1, 12)))
    steps = run_rule(tmp_path, script, max_ns=int(4.5 * MS))
    assert [(s[0] // MS, s[2], s[4]) for s in steps] == [(1, 5, "max_duration"), (6, 5, "max_duration"),
                                                         (11, 1, "open")]
    steps = run_rule(tmp_path, "mark\n" + script, max_ops=4)
    assert [(s[2], s[3], s[4]) for s in steps] == [(4, 1, "max_ops"), (4, 2, "max_ops"), (3, 3, "open")]


def test_the_bounds_hold_on_a_marked_thread_too(tmp_path: Path) -> None:
    script = "mark\n" + calls((1, 2), (3, 4), (5, 6))
    assert [s[4] for s in run_rule(tmp_path, script, max_ops=2)] == ["max_ops", "open"]


# ---- torch.h against its mirrors -------------------------------------------------------------

def test_step_record_tags_reasons_and_marker_words_match_the_header(tmp_path: Path) -> None:
    macros = {"optimizer": "OPTIMIZER", "profiler_step": "PROFILER", "gap": "GAP", "max_duration": "MAX_DURATION",
              "max_ops": "MAX_OPS", "thread_exit": "THREAD_EXIT"}
    assert set(macros) == set(STEP_END_REASONS) - {""}
    values = {"ev": "TORCH_EV_STEP", "py": "TORCH_ROOT_PYTHON >> 32", "step": "TORCH_ROOT_STEP >> 32",
              **{name: f"TORCH_STEP_END_{m}" for name, m in macros.items()}}
    for key in ("OPT", "PROF"):
        values |= {f"{key}{w}": f"TORCH_MARK_{key}_{w}" for w in ("W0", "W1", "M1")}
    c = measure(FOLDER, "torch.h", tmp_path, structs={STEP.c_struct: STEP.fields}, values=values)
    assert_mirror(c, STEP.c_struct, STEP.fmt, STEP.fields)
    assert c.values["ev"] == STEP.etype and OP.etype < STEP.etype <= 143
    assert (c.values["py"] << 32, c.values["step"] << 32) == (TORCH_ROOT_PYTHON, TORCH_ROOT_STEP)
    assert all(STEP_END_REASONS[c.values[name]] == name for name in macros)
    for key, name in {"OPT": b"Optimizer.step#", "PROF": b"ProfilerStep#"}.items():
        padded = name.ljust(16, b"\0")
        assert c.values[f"{key}W0"] == int.from_bytes(padded[:8], "little")
        assert c.values[f"{key}M1"] == (1 << 8 * (len(name) - 8)) - 1
        assert c.values[f"{key}W1"] == int.from_bytes(padded[8:16], "little") & c.values[f"{key}M1"]


def test_steps_and_tagged_roots_decode_to_epoch_keeping_the_tag() -> None:
    r = TorchReceiver(Config(), Context(), ListConsumer())
    off = r.clock.offset_ns
    raw = STEP.fmt.pack(129, 1, 7, 8, 13, 100, 900, 3)
    assert r.decode(129, raw) == TorchStep(7, 8, 100 + off, 900 + off, 13, 3, "optimizer")
    assert r.ctx.telemetry.get("otel_ebpf.torch.steps_cut") == 0
    r.decode(129, STEP.fmt.pack(129, 5, 7, 8, 10_000, 100, 900, 4))
    assert r.ctx.telemetry.get("otel_ebpf.torch.steps_cut", reason="max_ops") == 1
    with pytest.raises(ValueError, match="reason"):
        r.decode(129, STEP.fmt.pack(129, 0, 7, 8, 1, 100, 900, 4))
    r.op_at = lambda pid, ip: "addmm"  # type: ignore[method-assign]
    for tag in (TORCH_ROOT_PYTHON, TORCH_ROOT_STEP):
        op = r.decode(128, OP.fmt.pack(128, 7, 8, 0, 150, 160, 90, 80 | tag, 0x1000))
        assert op == TorchOp(7, 8, "addmm", 0, 150 + off, 160 + off, 90 + off, (80 + off) | tag)


def test_step_config_reaches_the_program_and_markers_are_looked_up_only_with_steps() -> None:
    import re

    cfg = build(Config, {"step_gap": "50ms", "step_max_duration": "2s", "step_max_ops": 500})
    flags = TorchReceiver(cfg, Context(), ListConsumer()).program_cflags()
    for flag in ("-DTORCH_STEPS=1", "-DTORCH_STEP_GAP_NS=50000000ULL", "-DTORCH_STEP_MAX_NS=2000000000ULL",
                 "-DTORCH_STEP_MAX_OPS=500"):
        assert flag in flags
    rx = re.compile(MARKER_REGEX)
    assert rx.match(b"_ZN5torch8autograd8profiler25record_function_enter_newERKNSt7__cxx1112basic_stringIcSt11"
                    b"char_traitsIcESaIcEEERKSt8optionalIS7_E")
    assert rx.match(b"_ZN5torch8autograd8profilerL24record_function_exit_newERKN3c1013intrusive_ptrINS1_20Python"
                    b"RecordFunctionENS2_6detail34intrusive_target_default_null_typeIS4_EEEE")
    assert not rx.match(b"_ZN5torch8autograd8profiler25record_function_enter_newERKNSt7__cxx11.cold")
    assert not rx.match(b"_ZN5torch8autograd8profilerL28record_function_enter_legacyERKNSt7__cxx11")
    off = TorchReceiver(build(Config, {"steps": False}), Context(), ListConsumer())
    assert "-DTORCH_STEPS=0" in off.program_cflags() and MARKER_REGEX not in off._symbol_regex()


def test_markers_attach_both_or_neither(caplog: pytest.LogCaptureFixture) -> None:
    r = TorchReceiver(Config(), Context(), ListConsumer())
    with caplog.at_level("WARNING"):  # a library whose symbol table lost the static exit function
        assert r._attach_markers("/x/libtorch_cpu.so", {"record_function_enter_new": 0x1000}) == 0
    assert "record_function_exit_new" in caplog.text and "gaps and bounds only" in caplog.text
    assert r.ctx.telemetry.get("otel_ebpf.probes.failed") == 0
