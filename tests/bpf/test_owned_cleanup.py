"""The agent's BPF programs are cleaned up by their receivers, never by BCC at exit (issue 18).

BCC 0.26 registers every ``BPF`` object's ``cleanup`` with ``atexit`` before it compiles. A command that ended
while the deferred starter thread was still loading a receiver met that thread's shutdown of the same program
at the interpreter's exit: a KeyError traceback and ioctl EBADF lines after the run's summary.
"""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.bpf

_PROGRAM = r'''
from otel_ebpf.bpf.loader import import_bcc, owned_program

bcc = import_bcc()


class Said:
    """Stands as a program's tracefile: BPF.cleanup() closes it, so closing says that cleanup ran."""
    def __init__(self, name):
        self.name = name

    def close(self):
        print(f"cleaned {self.name}", flush=True)


SRC = "int f(void *ctx) { return 0; }"
with owned_program():
    owned = bcc.BPF(text=SRC)
owned.tracefile = Said("owned")
plain = bcc.BPF(text=SRC)
plain.tracefile = Said("plain")
print("built", flush=True)
'''


def test_a_program_built_as_owned_is_not_cleaned_up_at_exit_and_others_still_are(bpf_ready: Any) -> None:
    out = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert "built" in out.stdout, out
    assert "cleaned plain" in out.stdout, out  # BCC's own behaviour kept for programs we do not own
    assert "owned" not in lines[lines.index("built"):], out
    assert "Traceback" not in out.stderr, out.stderr


_AGENT = r'''
import subprocess, sys
from otel_ebpf.service import settings
from otel_ebpf.service.agent import Agent


class Said:
    def close(self):
        print("cleaned at exit", flush=True)


sleeper = subprocess.Popen(["sleep", "30"])
cfg = settings.load(None, output=sys.argv[1], extra={"service": {"pipelines": {"default": {
    "receivers": ["cuda"], "processors": ["cuda"]}}}})
agent = Agent(cfg, target_pids=[sleeper.pid])
agent.start()
agent.receivers["cuda"].bpf.tracefile = Said()
sleeper.kill()
print("started", flush=True)
'''


def test_a_receivers_program_left_running_at_exit_is_not_cleaned_up_by_bcc(bpf_ready: Any, tmp_path: Any) -> None:
    """An agent whose process exits with a receiver still loaded (as when the deferred starter thread is still
    on it): BCC's exit cleanup does not run on the receiver's program; the kernel releases it with the fds."""
    out = subprocess.run([sys.executable, "-c", _AGENT, str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=120)
    assert "started" in out.stdout, out
    assert "cleaned at exit" not in out.stdout, out
