"""Issue 18, the start: ``otel-ebpf run -- CMD`` starts the command before the cuda and nccl programs
have compiled (service.deferred_start), and loses nothing for it.

The command is a shell that forks three Python processes which open the real libcudart at once and
call it 200 times each, one of them from a copy of the library at a path of its own: the shell and
its children run while the NCCL and then the CUDA receiver compile (one after the other, nccl first:
a child's open comes after the starter has begun nccl's), the library gate holds the children at
their opens (one thread: the second and third wait behind the first, and their stops are renewed
too), the starter hands the receivers the children (made before they loaded), and the gate resumes
them once the cuda receiver is attached to each one's path, the ones queued behind the first
included (LibraryGate.finish: the end of the start used to resume those unattached, and the copy's
calls went untraced). pause_timeout is 1.5 s here, less than the two compiles (~2.2 s on a 2-core
VM of 2026-12, where cuda's alone took 1.3-1.4 s and an earlier form of this test, cuda alone,
failed): the holds outlast it only because the gate renews the stops while the compile makes
progress (otel_ebpf.bpf.gate); without the renewals the pause guard would resume the children
early and their first calls would be missed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.support.otlp_sink import spans_from_jsonl

ROOT = Path(__file__).resolve().parents[2]
CALLS = 200
pytestmark = pytest.mark.bpf


def run(tmp_path: Path, config: str, *command: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(config)
    cfg.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EBPF_")}
    return subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--log-level", "info", "--config", str(cfg),
                           "--output", str(tmp_path / "out"), "--", *command], cwd=tmp_path, env={**env,
                          "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=180)


# the gate compiled into the lifecycle program (the default: otel_ebpf.bpf.gate_hosted), and, without the lifecycle
# receiver, the gate's own program; nccl compiles first (the pipeline's order)
PIPELINES = {gate: f"  pipelines:\n    default: {{receivers: [{r}], processors: [{r}], exporters: [file]}}\n"
             for gate, r in (("hosted", "lifecycle, nccl, cuda"), ("own", "nccl, cuda"))}


@pytest.mark.parametrize("gate", sorted(PIPELINES))
def test_the_command_starts_first_and_its_first_cuda_calls_are_all_traced(bpf_ready: None, cudart: Path,
                                                                          tmp_path: Path, gate: str) -> None:
    copy = tmp_path / "lib" / cudart.name  # the same library at a path of its own: attached on its own
    copy.parent.mkdir()
    shutil.copy(cudart, copy)
    child = tmp_path / "child.py"
    child.write_text(f"import ctypes, sys\nrt = ctypes.CDLL(sys.argv[1])\n"
                     f"for _ in range({CALLS}):\n    rt.cudaMemcpy(None, None, 4096, 1)\n")
    script = (f"echo started; for lib in {cudart} {copy} {cudart}; do {sys.executable} {child} $lib & done; "
              "wait; echo done")
    r = run(tmp_path, "receivers:\n  cuda:\n    span_rate_limit: 0\nservice:\n  pause_timeout: 1500ms\n"
                      "  health_endpoint: ''\n" + PIPELINES[gate], "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    # the gate compiled on its own only without a host: "receiver gate started in 0.00s" when hosted
    started = re.search(r"receiver gate started in ([0-9.]+)s", r.stderr)
    assert started and (float(started.group(1)) < 0.05) == (gate == "hosted"), r.stderr
    assert r.stdout.split() == ["started", "done"]
    err = r.stderr
    # the command was let go before the cuda receiver compiled
    assert re.search(r"tracing started in [0-9.]+s; loading in the background: .*cuda", err), err
    assert re.search(r"receiver cuda started in [0-9.]+s, in the background \([0-9.]+s after the command "
                     r"started; \d+ process(es)? it made meanwhile added\)", err), err
    # the child was held at its open until then, longer than pause_timeout, and none of its calls was missed
    held = re.search(r"gate: held a process that opened \S*libcudart\S* for ([0-9.]+)s, until the cuda receiver", err)
    assert held, err
    assert float(held.group(1)) > 1.5, "held past pause_timeout: the renewals were needed"
    assert "resumed by the pause guard" not in err and "did not attach in time" not in err, err
    per_pid = Counter(res.get("process.pid") for res, _, span in spans_from_jsonl(tmp_path / "out" / "traces.jsonl")
                      if span.name == "cudaMemcpy")
    # three children held at once, every call of each traced: the ones queued behind the first too, the copy too
    assert sorted(per_pid.values()) == [CALLS] * 3, (per_pid, err)
    assert "resumed at shutdown" not in err, err  # the stops queued behind the first were handled, not let go
    # each child's hold said (otel_ebpf.gate.held counts the same): the first, then the two queued behind it
    assert len(re.findall(r"gate: held a process that opened \S*libcudart\S* for [0-9.]+s", err)) == 3, err
    assert len(re.findall(r"for ([0-9.]+)s \(its open queued behind another's\)", err)) == 2, err


def test_a_command_that_ends_while_receivers_compile_exits_cleanly(bpf_ready: None, tmp_path: Path) -> None:
    r = run(tmp_path, "service:\n  health_endpoint: ''\n", "true")
    assert r.returncode == 0, r.stderr
    assert "loading in the background" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "flushing what was collected" in r.stderr
    assert (tmp_path / "out" / "traces.jsonl").exists()  # a relative cwd-free path: BCC's chdir did not move it


def test_deferred_start_off_loads_everything_first(bpf_ready: None, tmp_path: Path) -> None:
    r = run(tmp_path, "service:\n  deferred_start: false\n  health_endpoint: ''\n", "true")
    assert r.returncode == 0, r.stderr
    assert "tracing started in" in r.stderr and "loading in the background" not in r.stderr, r.stderr
    assert "in the background (" not in r.stderr
