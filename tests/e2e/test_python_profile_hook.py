"""The python receiver on CPython 3.11 (Debian's, built --with-dtrace), as a user runs it: without a
profile function the entry probe does not fire (gh-98894), which is said once with the fix; with
``receivers.python.profile_hook: true`` the same command gets its calls as spans."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.otlp_sink import spans_from_jsonl

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3.11"
pytestmark = pytest.mark.bpf
JOB = ("import sys, time\n"
       "def work():\n"
       "    time.sleep(0.005)\n"
       "def spin(n):\n"
       "    return sum(i for i in range(n))\n"
       "for _ in range(20): work()\n"
       "for _ in range(2000): spin(10)\n"
       "print('profile', sys.getprofile())\n")


def _run(tmp_path: Path, hook: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    if not os.path.exists(PYTHON):
        pytest.fail(f"{PYTHON} (Debian's python3.11, with USDT probes) is needed: scripts/setup.sh")
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "receivers": {"python": {"profile_hook": hook, "min_duration": "1ms"}},
        "service": {"pipelines": {"default": {"receivers": ["python"], "processors": ["python"],
                                              "exporters": ["file"]}}}}))
    config.chmod(0o600)
    job = tmp_path / "job.py"
    job.write_text(JOB)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--config", str(config), "--output", str(out),
                        "--", PYTHON, str(job)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    return r, out


def _work_spans(out: Path) -> int:
    path = out / "traces.jsonl"
    return sum(1 for _, _, s in spans_from_jsonl(path) if s.name == "job.work") if path.exists() else 0


def test_without_the_hook_no_call_is_timed_and_that_is_said_once_with_the_fix(bpf_ready, tmp_path):
    r, out = _run(tmp_path, hook=False)
    assert r.returncode == 0, r.stderr
    assert "profile None" in r.stdout
    assert _work_spans(out) == 0
    assert r.stderr.count("python:function__entry does not") == 1, r.stderr
    assert "receivers.python.profile_hook: true" in r.stderr


def test_profile_hook_makes_the_command_s_calls_spans(bpf_ready, tmp_path):
    r, out = _run(tmp_path, hook=True)
    assert r.returncode == 0, r.stderr
    assert "profile <class 'slice'>" in r.stdout  # the hook was set in the command's interpreter
    assert "Python profile hook: the command runs with" in r.stderr
    assert _work_spans(out) == 20
    assert "python:function__entry does not" not in r.stderr
