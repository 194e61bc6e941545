"""otel_ebpf.host.stacks against real processes and the real py-spy: a Python process stuck in named
functions (main thread and a second thread), a process that exits during the capture, a process with
no interpreter, a capture without ptrace permission, and timeouts that never leave the target stopped."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from otel_ebpf.host import stacks
from otel_ebpf.host.procfs import stat_fields

TARGET = """\
import sys, threading, time

def stuck_in_dataloader_fetch():
    time.sleep(3600)  # MAIN

def waits_in_second_thread(depth):
    if depth:
        return waits_in_second_thread(depth - 1)
    time.sleep(3600)  # SECOND

threading.Thread(target=waits_in_second_thread, args=(int(sys.argv[1]),), name="nccl-waiter", daemon=True).start()
time.sleep(0.2)
print("ready", flush=True)
stuck_in_dataloader_fetch()
"""


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(TARGET.splitlines(), 1) if text.endswith(f"# {marker}"))


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "stuck_job.py"
    path.write_text(TARGET)
    return path


Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def spawn(script: Path) -> Iterator[Spawn]:
    """Starts the stuck Python job (second thread ``depth`` calls deep) and waits until it is in place."""
    procs: list[subprocess.Popen[str]] = []

    def start(depth: int = 0) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, str(script), str(depth)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        return proc
    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _state(pid: int) -> str:
    fields = stat_fields(pid)
    assert fields is not None
    return fields[0].decode()


def _tracer(pid: int) -> int:
    """TracerPid of /proc/PID/status: 0 when no tracer is attached."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("TracerPid:"))
    return int(line.split()[1])


def test_py_spy_is_found_next_to_this_interpreter() -> None:
    exe = stacks.find_py_spy()
    assert exe is not None and os.access(exe, os.X_OK), "py-spy is a dependency (pyproject.toml)"


@pytest.mark.parametrize("native", [False, True])
def test_stuck_functions_of_the_main_and_a_second_thread_are_captured(spawn: Spawn, script: Path,
                                                                      native: bool) -> None:
    proc = spawn()
    cap = stacks.capture(proc.pid, native=native)
    assert cap.outcome == "ok", cap.message
    main = cap.main_thread()
    assert main is not None and main.tid == proc.pid and main.name == "MainThread"
    assert cap.innermost() == stacks.Frame("stuck_in_dataloader_fetch", str(script), _line("MAIN"))
    second = next(t for t in cap.threads if t.name == "nccl-waiter")
    python = [f for f in second.frames if f.is_python]
    assert python[0] == stacks.Frame("waits_in_second_thread", str(script), _line("SECOND"))
    assert main.active is False  # sleeping
    text = cap.text.splitlines()
    assert text[0] == f'Thread {proc.pid} (idle): "MainThread"'
    assert f"    stuck_in_dataloader_fetch (stuck_job.py:{_line('MAIN')})" in text
    assert f"    waits_in_second_thread (stuck_job.py:{_line('SECOND')})" in text
    assert not cap.truncated and cap.native == native
    assert _state(proc.pid) in "SR"


def test_text_threads_and_frames_are_bounded_and_say_so(spawn: Spawn) -> None:
    proc = spawn(depth=30)
    cap = stacks.capture(proc.pid, max_bytes=120, max_frames=5)
    assert cap.outcome == "ok", cap.message
    assert len(cap.text.encode()) <= 120 and cap.truncated_bytes > 0 and cap.truncated
    second = next(t for t in cap.threads if t.name == "nccl-waiter")
    assert len(second.frames) == 5 and second.frames_dropped >= 26
    whole = stacks.capture(proc.pid, max_frames=5)
    assert "outer frames left off" in whole.text and whole.truncated_bytes == 0
    one = stacks.capture(proc.pid, max_threads=1)
    assert len(one.threads) == 1 and one.threads_dropped == 1 and one.truncated


def test_a_process_that_exits_during_the_capture_is_exited_not_an_error(spawn: Spawn, tmp_path: Path) -> None:
    proc = spawn()
    py_spy = stacks.find_py_spy()
    # the real py-spy, started once the capture has begun and the target has been killed (left a zombie)
    wrapper = tmp_path / "py-spy"
    wrapper.write_text(f"#!/bin/sh\nkill -9 {proc.pid}\nsleep 0.1\nexec {py_spy} \"$@\"\n")
    wrapper.chmod(0o755)
    cap = stacks.capture(proc.pid, executable=str(wrapper))
    assert cap.outcome == "exited", cap
    assert "exited during the capture" in cap.message and not cap.threads
    proc.wait()
    gone = stacks.capture(proc.pid)
    assert gone.outcome == "exited" and f"no process {proc.pid}" in gone.message


def test_killing_the_target_at_any_moment_gives_ok_or_exited(spawn: Spawn) -> None:
    outcomes: list[str] = []
    for delay in (0.0, 0.002, 0.005, 0.01, 0.02):
        proc = spawn()
        threading.Timer(delay, proc.kill).start()
        for _ in range(5):
            outcomes.append(stacks.capture(proc.pid, native=delay > 0.005).outcome)
    assert set(outcomes) <= {"ok", "exited"} and "exited" in outcomes, outcomes


def test_a_process_without_an_interpreter_has_no_python_frames() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.1)
        cap = stacks.capture(proc.pid)
        assert cap.outcome == "not_python" and cap.message.startswith("no Python frames: ")
        assert "Failed to find python version" in cap.message and not cap.threads
        native = stacks.capture(proc.pid, native=True)
        assert native.outcome == "not_python"
        (thread,) = native.threads
        assert thread.tid == proc.pid and thread.name == "sleep" and native.text.startswith(f"Thread {proc.pid}")
        if os.geteuid() == 0:  # /proc/PID/task/TID/stack is root-only
            assert any("nanosleep" in f.function and f.file == "[kernel]" for f in thread.frames), thread
        assert native.innermost() is None
    finally:
        proc.kill()
        proc.wait()


_AS_NOBODY = """
import json, sys
from otel_ebpf.host import stacks
cap = stacks.capture(int(sys.argv[1]))
print(json.dumps([cap.outcome, cap.message]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user (nobody) needs root")
def test_without_ptrace_permission_the_message_says_how_to_fix_it(spawn: Spawn) -> None:
    import json
    import pwd

    target = spawn()  # owned by root
    nobody = pwd.getpwnam("nobody")

    def drop() -> None:
        os.setgroups([])
        os.setresgid(nobody.pw_gid, nobody.pw_gid, nobody.pw_gid)
        os.setresuid(nobody.pw_uid, nobody.pw_uid, nobody.pw_uid)

    root = Path(__file__).resolve().parents[3]
    r = subprocess.run([sys.executable, "-c", _AS_NOBODY, str(target.pid)], capture_output=True, text=True,
                       preexec_fn=drop, cwd=root, timeout=30, env={**os.environ, "PYTHONPATH": str(root)})
    assert r.returncode == 0, r.stderr
    outcome, message = json.loads(r.stdout)
    assert outcome == "permission", message
    assert f"no ptrace permission on pid {target.pid}" in message
    assert "CAP_SYS_PTRACE" in message and "kernel.yama.ptrace_scope" in message
    assert _state(target.pid) in "SR"


@pytest.mark.parametrize("native", [False, True])
def test_a_timed_out_capture_never_leaves_the_target_stopped(spawn: Spawn, native: bool) -> None:
    proc = spawn(depth=20)
    outcomes = []
    for timeout in (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.03):
        for _ in range(3):
            cap = stacks.capture(proc.pid, native=native, timeout_s=timeout)
            outcomes.append(cap.outcome)
            assert cap.outcome in ("ok", "timeout"), cap
            assert cap.outcome == "ok" or "killed it" in cap.message
            assert cap.duration_s < timeout + 2.0
            time.sleep(0.005)  # a stop the kernel undoes after the tracer's death shows here
            assert _state(proc.pid) not in ("t", "T") and _tracer(proc.pid) == 0, (timeout, cap)
    assert "timeout" in outcomes
    assert stacks.capture(proc.pid, native=native).outcome == "ok"  # and nothing is left attached


def test_one_capture_per_pid_at_a_time(spawn: Spawn, tmp_path: Path) -> None:
    proc = spawn()
    slow = tmp_path / "py-spy"
    slow.write_text(f"#!/bin/sh\nsleep 0.5\nexec {stacks.find_py_spy()} \"$@\"\n")
    slow.chmod(0o755)
    first: list[stacks.StackCapture] = []
    t = threading.Thread(target=lambda: first.append(stacks.capture(proc.pid, executable=str(slow))))
    t.start()
    time.sleep(0.2)
    second = stacks.capture(proc.pid)
    t.join()
    assert second.outcome == "busy" and "already running" in second.message
    assert first[0].outcome == "ok", first[0].message


def test_no_py_spy_is_missing_and_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacks, "find_py_spy", lambda: None)
    cap = stacks.capture(os.getpid())
    assert cap.outcome == "missing" and "pip install 'py-spy>=0.4.1'" in cap.message
    bad = stacks.capture(os.getpid(), executable="/nonexistent/py-spy")
    assert bad.outcome == "error" and "cannot run /nonexistent/py-spy" in bad.message
