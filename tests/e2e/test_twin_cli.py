"""``otel-ebpf twin`` as a user runs it: the option and set-up errors (exit 2, 3, before anything starts), and a
real 2 nodes x 2 GPUs job whose rank 3 fails: the command exits 1, names the failure, and the node that
would wait (torch 2.11's exit barrier) is stopped by the kill-on-bad-exit instead. Needs root (runs in CI)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_ebpf.twin import TwinSetupError, find_env

pytestmark = [pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def twin(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_ebpf", "twin", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_a_missing_script_is_an_option_error(tmp_path: Path) -> None:
    run = twin("--", str(tmp_path / "nope.py"))
    assert run.returncode == 2 and f"no such script: {tmp_path / 'nope.py'}" in run.stderr, run.stderr
    run = twin()
    assert run.returncode == 2 and "give the program after '--'" in run.stderr, run.stderr


def test_a_missing_twin_environment_names_the_setup_command(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    run = twin("--", str(script), env={"OTEL_EBPF_TWIN_VENV": str(tmp_path / "no-venv")})
    assert run.returncode == 3 and "scripts/setup.sh" in run.stderr, run.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="drops root itself")
def test_not_root_is_a_host_error() -> None:
    script = ROOT / "tests" / "twin" / "programs" / "cluster_allreduce.py"  # readable by nobody, unlike tmp_path
    run = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                          "otel_ebpf", "twin", "--", str(script)], cwd=ROOT, capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 3 and "need root" in run.stderr, run.stderr


@pytest.mark.bpf
def test_a_failed_rank_fails_the_command_and_stops_every_node(tmp_path: Path) -> None:
    try:
        find_env()
    except TwinSetupError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the twin's tests must run in CI but cannot: {exc}")
        pytest.skip(f"no twin environment: {exc}")
    script = tmp_path / "job.py"
    # one write per line: the node's ranks share its output, and unbuffered print() writes each argument apart
    script.write_text("import os, sys\n"
                      "sys.stdout.write(f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\\n\")\n"
                      "sys.stdout.flush()\n"
                      "sys.exit(1 if os.environ['RANK'] == '3' else 0)\n")
    run = twin("--no-trace", "--output", str(tmp_path / "out"), "--timeout", "200", "--", str(script), timeout=260)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "[node-1] rank 3 of 4" in run.stdout and "node-1: torchrun reports a failed rank" in run.stdout, run.stdout
    assert "(timed out)" not in run.stdout and "untraced (--no-trace)" in run.stdout, run.stdout
    assert (tmp_path / "out" / "logs" / "node-0.log").exists()
