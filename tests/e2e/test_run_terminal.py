"""``otel-ebpf run`` on a terminal (a pseudo-terminal here): the live progress line on the bottom
row (otel_ebpf/service/progress.py), then the end-of-run summary; ``--quiet`` leaves only the summary.
The agent runs the nvml receiver only, so no BPF is needed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.test_health import ROOT, write_config


def _run_on_a_terminal(tmp_path: Path, *extra: str) -> str:
    """``otel-ebpf run`` with stderr on a 24x80 pseudo-terminal; returns what the terminal got."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "run", *extra, "--config",
                             str(write_config(tmp_path, "")), "--", "sleep", "2.5"], cwd=ROOT, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    return b"".join(chunks).decode(errors="replace")


def test_run_on_a_terminal_shows_a_live_progress_line_then_the_summary(tmp_path: Path) -> None:
    out = _run_on_a_terminal(tmp_path)
    assert "\x1b[1;23r" in out  # rows 1-23 scroll; row 24 is the status line
    line = out.index("\x1b[24;1H\x1b[2Kotel-ebpf  0:0")
    assert "events " in out[line:] and "dropped " in out[line:]
    reset = out.index("\x1b[1;24r")
    assert reset > line and out.index("otel-ebpf: ", reset) > reset  # the summary comes after


def test_quiet_run_on_a_terminal_prints_only_the_summary(tmp_path: Path) -> None:
    out = _run_on_a_terminal(tmp_path, "--quiet")
    assert "\x1b[" not in out and "otel-ebpf: " in out
