"""Issue 18, "first use": with the default config (no --config), `otel-ebpf run` of a shell that
runs 30 short-lived programs exports a process span, with its exec event and command line, for
each of them. Before the lifecycle receiver was split from sched (off by default), it exported none.
Each span's resource has the program's command line too, though most of them exit before the agent
can read their /proc: about half of the 30 lacked it while the resource came from /proc only."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.otlp_sink import decode_attrs, spans_from_jsonl

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "for i in $(seq 30); do /bin/true; done"
pytestmark = pytest.mark.bpf


def test_default_run_exports_an_exec_span_per_short_lived_process(bpf_ready: None, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EBPF_")}  # the built-in defaults
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--", "sh", "-c", SCRIPT], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    rows = spans_from_jsonl(tmp_path / "otel-ebpf-out" / "traces.jsonl")
    lifecycle = [(res, span) for res, scope, span in rows if scope == "otel_ebpf.lifecycle"]
    trues = [(res, span) for res, span in lifecycle if span.name == "process true"]
    assert len(trues) == 30, sorted(span.name for _, span in lifecycle)
    assert len({decode_attrs(span.attributes)["process.pid"] for _, span in trues}) == 30
    for res, span in trues:
        a = decode_attrs(span.attributes)
        assert a["process.command_line"] == "/bin/true" and a["process.exit.code"] == 0
        (ev,) = span.events
        assert ev.name == "process.exec" and decode_attrs(ev.attributes)["process.command_args"] == ["/bin/true"]
        assert res["process.pid"] == a["process.pid"]  # each on its own process's resource
    (shell,) = [span for _, span in lifecycle if decode_attrs(span.attributes).get("process.command_line")
                == f"sh -c {SCRIPT}"]
    assert decode_attrs(shell.attributes)["process.exit.code"] == 0
    shell_pid = decode_attrs(shell.attributes)["process.pid"]
    # the resource: from /proc when the agent read it in time, else from what the kernel reported
    lacking = [res for res, _ in trues if res.get("process.command_line") != "/bin/true"
               or res.get("process.command_args") != ["/bin/true"] or res.get("process.parent_pid") != shell_pid
               or res.get("process.executable.name") != "true" or "process.executable.path" not in res]
    assert not lacking, lacking
