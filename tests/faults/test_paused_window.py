"""The agent *and its pause guard supervisor* SIGKILLed inside the *paused window*
(``pause_on_load``): a process that opened libcudart is held with SIGSTOP by the BPF program
until the agent attaches and sends SIGCONT. Either survivor would resume it (the supervisor
after pause_timeout or once the agent is gone: tests/faults/test_pause_guard.py); with both
killed together (an OOM kill of their cgroup) the stop, recorded in a map pinned on bpffs
(otel_ebpf/bpf/paused.py), is resumed by the next agent, which leaves alone a process its user
stopped.

The window is made deterministic: pause_timeout is 60 s (leases of 30 s), the agent is itself
stopped (SIGSTOP) once its probes are loaded, so it cannot read the library-open record nor
resume the target; then the supervisor and the agent are SIGKILLed.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from otel_ebpf.bpf.paused import PAUSED_DIR
from tests.faults.agentproc import agent, counter_total, process_state, wait_until
from tests.support.otlp_sink import metrics_from_jsonl

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(400)]

# waits for a go file, then dlopens libcudart (the BPF program stops it at that openat), makes one
# call and writes a done file
_TARGET = """
import ctypes, os, sys, time
cudart, go, done = sys.argv[1:4]
while not os.path.exists(go):
    time.sleep(0.02)
rt = ctypes.CDLL(cudart)
rt.cudaMemcpy(None, None, 4096, 1)
open(done, "w").write("done")
"""
# loads libcudart at once, then sleeps until killed: a process its user will stop (kill -STOP)
_USER_STOPPED = """
import ctypes, sys, time
ctypes.CDLL(sys.argv[1])
while True:
    time.sleep(0.05)
"""


def _pins_of(agent_pid: int) -> list[str]:
    try:
        return sorted(n for n in os.listdir(PAUSED_DIR) if re.fullmatch(rf"[\w.]+-{agent_pid}-\d+-\d+", n))
    except OSError:
        return []


def _started(err: Path) -> bool:
    return err.exists() and "tracing started" in err.read_text(errors="replace")


def test_agent_killed_in_paused_window_next_agent_resumes_only_its_stop(bpf_ready, cudart, tmp_path):
    go, done = tmp_path / "go", tmp_path / "done"
    target = subprocess.Popen([sys.executable, "-c", _TARGET, str(cudart), str(go), str(done)])
    user = subprocess.Popen([sys.executable, "-c", _USER_STOPPED, str(cudart)])
    err1, err2 = tmp_path / "agent1.err", tmp_path / "agent2.err"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("service:\n  pause_timeout: 60s\n")
    cfg.chmod(0o600)
    first = agent("--log-level", "info", "run", "--pid", str(target.pid), "--config", str(cfg), "--output",
                  str(tmp_path / "out1"), stderr=err1)
    second = None
    try:
        assert wait_until(lambda: _started(err1), 120), err1.read_text()
        assert wait_until(lambda: _pins_of(first.pid), 10), "the first agent pinned no map of paused processes"
        first.send_signal(signal.SIGSTOP)  # the window stays open: nothing reads the library-open record
        go.touch()
        assert wait_until(lambda: process_state(target.pid) == "T", 30), process_state(target.pid)
        pins = _pins_of(first.pid)
        supervisors = [c for c in psutil.Process(first.pid).children() if "otel_ebpf.bpf.pauseguard" in
                       " ".join(c.cmdline())]
        assert len(supervisors) == 1, supervisors
        supervisors[0].kill()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=240)
        user.send_signal(signal.SIGSTOP)
        assert wait_until(lambda: process_state(user.pid) == "T", 10)
        # left behind: the target stays stopped, the pins of the dead agent stay (one per pausing receiver)
        time.sleep(1.0)
        assert process_state(target.pid) == "T" and not done.exists()
        assert _pins_of(first.pid) == pins and any(p.startswith("cuda-") for p in pins), pins

        t0 = time.monotonic()
        second = agent("--log-level", "info", "run", "--pid", str(target.pid), "--output",
                       str(tmp_path / "out2"), stderr=err2)
        assert wait_until(done.exists, 120), (process_state(target.pid), err2.read_text())
        resumed_s = time.monotonic() - t0
        assert target.wait(timeout=30) == 0
        assert second.wait(timeout=120) == 0, err2.read_text()  # it exits when its only target has
        log = err2.read_text()
        assert re.search(rf"WARNING .*cuda: resumed pid {target.pid} .*agent pid {first.pid}", log), log
        assert f"resumed pid {user.pid}" not in log
        assert _pins_of(first.pid) == [] and _pins_of(second.pid) == []  # stale removed, own unpinned at exit
        rows = metrics_from_jsonl(tmp_path / "out2" / "metrics.jsonl")
        assert counter_total(rows, "otel_ebpf.pauses.recovered", receiver="cuda") == 1
        # the process its user stopped was never ours: still stopped
        assert process_state(user.pid) == "T"
        print(f"paused window: pid {target.pid} left stopped by the SIGKILLed agent {first.pid} (pins {pins}); "
              f"the next agent resumed it {resumed_s:.1f}s after its launch; user-stopped pid {user.pid} untouched")
    finally:
        go.touch()
        for p in (first, second, target):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=240)
        user.kill()
        user.wait(timeout=30)


def test_only_recorded_stopped_same_processes_are_resumed(bpf_ready):
    """resume_recorded on a real BPF hash map laid out as oe_paused: one process per case."""

    from otel_ebpf.bpf.loader import import_bcc
    from otel_ebpf.bpf.paused import resume_recorded

    b = import_bcc().BPF(text="struct oe_paused_key { u32 tgid; u32 _pad; u64 ts; };\n"
                              "struct oe_paused { u64 boot_ns; u64 ts; };\n"
                              "BPF_HASH(oe_paused, struct oe_paused_key, struct oe_paused, 16);\n")
    kids = {k: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            for k in ("ours", "reused_pid", "running", "user_stopped")}
    try:
        now = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        table = b["oe_paused"]
        for k in ("ours", "reused_pid", "user_stopped"):
            os.kill(kids[k].pid, signal.SIGSTOP)
        assert wait_until(lambda: all(process_state(kids[k].pid) == "T"
                                      for k in ("ours", "reused_pid", "user_stopped")), 10)
        table[table.Key(kids["ours"].pid, 0, 1)] = table.Leaf(now, 1)
        table[table.Key(kids["running"].pid, 0, 2)] = table.Leaf(now, 2)
        table[table.Key(kids["reused_pid"].pid, 0, 3)] = table.Leaf(1, 3)  # stopped at boot: before this process
        assert resume_recorded(table.map_fd, "cuda", why="test") == [kids["ours"].pid]
        assert wait_until(lambda: process_state(kids["ours"].pid) in ("R", "S"), 10)
        assert process_state(kids["reused_pid"].pid) == "T"
        assert process_state(kids["user_stopped"].pid) == "T"
    finally:
        for p in kids.values():
            p.kill()
            p.wait(timeout=30)
        b.cleanup()
