"""`otel-ebpf check` as a user without privileges runs it: it names the fault (not root, no CAP_BPF,
CAP_PERFMON, CAP_SYS_ADMIN), not a tracefs mount that is there, and says NVML's state in one row."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from otel_ebpf.receivers.nvml.presence import nvidia_gpus
from otel_ebpf.service.check import tracefs_mounts

ROOT = Path(__file__).resolve().parents[2]


def _rows(stdout: str) -> dict[str, str]:
    """capability -> its status and text (wrapped lines joined)."""
    rows: dict[str, str] = {}
    name = ""
    for line in stdout.splitlines()[2:]:
        cells = [c.strip() for c in line.split(" | ", 2)]
        if len(cells) < 3:
            continue
        if cells[0]:
            name = cells[0]
            rows[name] = f"{cells[1]} {cells[2]}"
        else:
            rows[name] += " " + cells[2]
    return rows


def test_unprivileged_check_names_privileges_not_tracefs() -> None:
    if not Path("/usr/bin/setpriv").exists():
        pytest.fail("setpriv (util-linux) is needed to drop privileges in this test")
    if os.geteuid() != 0:
        pytest.fail("dropping to uid 65534 needs root (the e2e tests run as root)")
    with tempfile.TemporaryDirectory() as home:  # nobody's cwd: somewhere it may read
        Path(home).chmod(0o755)
        r = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                            "-m", "otel_ebpf", "check"], capture_output=True, text=True, timeout=60, cwd=home,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    assert r.returncode == 3, r.stdout + r.stderr
    rows = _rows(r.stdout)
    assert rows["privileges"].startswith("MISSING not root (uid 65534) and missing CAP_BPF, CAP_PERFMON, "
                                         "CAP_SYS_ADMIN"), rows["privileges"]
    assert "fix: run it as root" in rows["privileges"]
    tracefs = rows["tracefs + uprobes"]
    if not tracefs_mounts():
        pytest.fail("tracefs is not mounted on this host: the agent could not run as root either")
    assert "is mounted but only root can read it" in tracefs and "mount -t tracefs" not in r.stdout, tracefs
    assert "see 'privileges'" in rows["BPF load (tracepoints, ring buffer)"]
    assert r.stdout.rstrip().splitlines()[-1] == (
        "eBPF cannot run here: fix privileges; tracefs + uprobes and BPF load (tracepoints, ring buffer) fail "
        "because of privileges")
    nvml = [line for line in r.stdout.splitlines() if "NVML" in line]
    assert len(nvml) == 1, nvml  # one row, said once
    if not nvidia_gpus() and "NVML (GPU metrics)" in rows and not rows["NVML (GPU metrics)"].startswith("ok"):
        assert rows["NVML (GPU metrics)"].startswith("info no NVIDIA driver/GPU: NVML metrics off: ")
