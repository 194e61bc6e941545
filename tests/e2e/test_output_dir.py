"""An output directory that cannot be written is a config error naming it, before anything
starts (exit 2, nothing listening, the traced command never run), not retried writes and
warnings after the job ran.

The gateway runs unprivileged, so it is checked both as root (a read-only file system, a path
under a regular file) and as an unprivileged user (a root-owned directory)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_FREE_PORTS = ["--grpc-endpoint", "127.0.0.1:0", "--http-endpoint", "127.0.0.1:0"]


def _gateway(output: Path, *prefix: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "otel_ebpf", "gateway", "--output", str(output),
                           *_FREE_PORTS], capture_output=True, text=True, timeout=60, cwd="/",
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _refused(r: subprocess.CompletedProcess[str], directory: Path, reason: str) -> None:
    assert r.returncode == 2, r.stderr
    assert "'exporters.file.directory'" in r.stderr and f"output directory {directory}" in r.stderr, r.stderr
    assert reason in r.stderr and "listening" not in r.stdout


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.fail("mounting a read-only tmpfs needs root (the e2e tests run as root)")
    d = tmp_path / "ro"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], check=True)
    yield d
    subprocess.run(["umount", str(d)], check=True)


def test_read_only_directory_is_a_config_error(read_only: Path) -> None:
    _refused(_gateway(read_only), read_only, "Read-only file system")
    _refused(_gateway(read_only / "new"), read_only / "new", "Read-only file system")  # cannot be made


def test_path_under_a_regular_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "out"
    _refused(_gateway(out), out, "Not a directory")


def test_unprivileged_user_without_write_access_gets_a_config_error() -> None:
    if not Path("/usr/bin/setpriv").exists():
        pytest.fail("setpriv (util-linux) is needed to drop privileges in this test")
    with tempfile.TemporaryDirectory() as top:  # not tmp_path: pytest-of-root is 0700, the user could not reach it
        Path(top).chmod(0o755)
        out = Path(top) / "root-owned"
        out.mkdir(mode=0o755)
        r = _gateway(out, "/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    _refused(r, out, "Permission denied")


def test_run_with_a_read_only_output_fails_before_the_command_runs(read_only: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--output", str(read_only / "out"), "--",
                        "touch", str(marker)], capture_output=True, text=True, timeout=60, cwd="/",
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    _refused(r, read_only / "out", "Read-only file system")
    assert not marker.exists(), "the traced command ran although the agent could not start"
    assert "WARNING" not in r.stderr, r.stderr  # no retried writes before the error


def test_run_that_makes_no_span_still_leaves_traces_and_metrics_files(tmp_path: Path) -> None:
    """README: ``--output DIR`` gets ``traces.jsonl`` and ``metrics.jsonl``: made when the file exporter
    starts, so a job with no span (here: only the nvml receiver, no GPU) leaves an empty traces.jsonl."""
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("service:\n  pipelines:\n    default: {receivers: [nvml], processors: [], exporters: [file]}\n")
    cfg.chmod(0o600)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "otel_ebpf", "run", "--config", str(cfg), "--output", str(out), "--",
                        "true"], capture_output=True, text=True, timeout=60, cwd="/",
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert (out / "traces.jsonl").read_text() == ""
    assert (out / "metrics.jsonl").exists() and not (out / "logs.jsonl").exists()
