"""The Python receiver's real USDT probes on real interpreters (/usr/bin/python3: Debian's
CPython, built --with-dtrace).

CPython 3.11 to 3.14 fire python:function__entry only while a profile or trace function is
set (CPython gh-98894; function__return always fires), so the workloads that check timed
spans set a do-nothing C profile function (``sys.setprofile(slice)``: no Python frame of its
own). One test runs without it and checks the receiver says why no call can be timed.
Every wait is bounded.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import TargetError
from otel_ebpf.core.events import ProcessExit
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.receivers.python import Config, NoUsdtError, PythonReceiver, create
from otel_ebpf.receivers.python.events import PythonCall
from otel_ebpf.receivers.python.receiver import NO_ENTRY_MESSAGE
from otel_ebpf.bpf.python_usdt import find_sites

pytestmark = pytest.mark.bpf

PYTHON = "/usr/bin/python3"
WORKLOAD = """
import sys, time, threading
sys.path.insert(0, {libdir!r})
import helper
if "--profile-hook" in sys.argv:  # CPython gh-98894: function__entry fires only with a profile function
    sys.setprofile(slice)
    threading.setprofile(slice)

def slow():
    time.sleep(0.05)

def fast(x):
    return x + 1

def outer():
    for _ in range(5):
        slow()
    helper.slow_helper()

def main():
    if "--wait" in sys.argv:
        sys.stdin.readline()
    time.sleep(float(sys.argv[1]))  # lets an exec-time attach finish first
    outer()
    s = 0
    for _ in range(10000):
        s = fast(s)
    print("done", s, flush=True)

main()
"""
HELPER = """
import time

def slow_helper():
    time.sleep(0.03)
"""


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper.py").write_text(textwrap.dedent(HELPER))
    (tmp_path / "app").mkdir()
    path = tmp_path / "app" / "workload.py"
    path.write_text(WORKLOAD.format(libdir=str(tmp_path / "lib")))
    return path


def _wait_for(what: str, cond: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def traced(argv: list[str], config: Config) -> Iterator[tuple[subprocess.Popen[str], PythonReceiver, ListConsumer]]:
    """Start ``argv`` (it waits for a line on stdin), attach, yield; the caller sends the line."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    receiver = None
    try:
        time.sleep(0.3)  # the interpreter is up and waiting on stdin
        sink = ListConsumer()
        receiver = create(config, Context(target_pids=[proc.pid]), sink)
        receiver.start()
        yield proc, receiver, sink
    finally:
        if receiver is not None:
            receiver.shutdown()
        if proc.poll() is None:
            proc.kill()


def _run(proc: subprocess.Popen[str], sink: ListConsumer) -> list[PythonCall]:
    out, _ = proc.communicate("go\n", timeout=60)
    assert out.startswith("done 10000"), out
    _wait_for("the ProcessExit", lambda: any(isinstance(e, ProcessExit) for e in sink.events))
    return [e for e in sink.events if isinstance(e, PythonCall)]


def test_slow_calls_become_timed_nested_events_and_fast_ones_are_filtered(bpf_ready: None, workload: Path) -> None:
    cfg = build(Config, {"min_duration": "10ms"})
    with traced([PYTHON, str(workload), "0", "--wait", "--profile-hook"], cfg) as (proc, receiver, sink):
        assert receiver.attached_pids == [proc.pid]
        calls = _run(proc, sink)
    by_name: dict[str, list[PythonCall]] = {}
    for c in calls:
        by_name.setdefault(c.function, []).append(c)
    assert "fast" not in by_name  # 10,000 calls, each far below 10 ms
    slow = by_name["slow"]
    assert len(slow) == 5
    def_line = workload.read_text().splitlines().index("def slow():") + 1  # entry: the def line
    for c in slow:
        assert 50e6 <= c.end_ns - c.start_ns < 500e6
        assert c.file == str(workload) and c.line == def_line and c.tid == proc.pid
    (outer,) = by_name["outer"]
    assert outer.end_ns - outer.start_ns >= 5 * 50e6 + 30e6
    assert all(c.parent_start == outer.start_ns and c.depth == outer.depth + 1 for c in slow)
    assert all(c.root_start == outer.root_start for c in slow)
    (helper,) = by_name["slow_helper"]
    assert helper.parent_start == outer.start_ns and helper.file.endswith("/lib/helper.py")


def test_path_prefix_filter_runs_in_the_kernel(bpf_ready: None, workload: Path) -> None:
    app_dir = str(workload.parent) + "/"
    cfg = build(Config, {"min_duration": "10ms", "path_prefixes": ["/nonexistent/", app_dir]})
    with traced([PYTHON, str(workload), "0", "--wait", "--profile-hook"], cfg) as (proc, _receiver, sink):
        calls = _run(proc, sink)
    names = sorted(c.function for c in calls)
    assert names == ["outer"] + ["slow"] * 5  # helper.py is outside the prefix (and main never returns first)
    assert all(c.file.startswith(app_dir) for c in calls)


def test_a_process_that_execs_the_interpreter_is_attached_at_exec(bpf_ready: None, workload: Path) -> None:
    cfg = build(Config, {"min_duration": "10ms"})
    argv = ["/bin/sh", "-c", f"read line; exec {PYTHON} {workload} 0.5 --profile-hook"]
    with traced(argv, cfg) as (proc, receiver, sink):
        assert receiver.attached_pids == []  # a shell, not Python
        calls = _run(proc, sink)
        assert proc.pid not in receiver.attached_pids  # detached at exit
    assert sorted(c.function for c in calls if c.function == "slow") == ["slow"] * 5
    assert {c.pid for c in calls} == {proc.pid}


def test_without_a_profile_function_the_receiver_names_cpython_gh_98894(
        bpf_ready: None, workload: Path, caplog: pytest.LogCaptureFixture) -> None:
    version = subprocess.run([PYTHON, "-c", "import sys; print(sys.version_info[1])"], capture_output=True,
                             text=True, check=True, timeout=30).stdout
    if not 11 <= int(version) <= 14:
        pytest.skip(f"{PYTHON} is 3.{version.strip()}: function__entry fires without a profile function")
    with caplog.at_level(logging.WARNING), traced([PYTHON, str(workload), "0", "--wait"], Config()) as (
            proc, receiver, sink):
        calls = _run(proc, sink)
        _wait_for("the unpaired-return count", lambda: receiver.ctx.telemetry.get(
            "otel_ebpf.python.unpaired_returns") >= 10000)
    assert calls == []
    assert NO_ENTRY_MESSAGE in caplog.text and "sys.setprofile(slice)" in caplog.text


NO_USDT = ["/bin/true", *sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3.[0-9]*"))[:2]]


@pytest.mark.parametrize("path", NO_USDT)
def test_an_interpreter_without_usdt_gets_a_clear_message(bpf_ready: None, path: str) -> None:
    with pytest.raises(NoUsdtError) as err:
        find_sites(path)
    text = str(err.value)
    assert path.split("/")[-1] in text and "--with-dtrace" in text
    assert "'torch' receiver" in text and "_PyEval_EvalFrameDefault" in text
    # configured explicitly, the receiver refuses to start, before loading anything
    receiver = create(build(Config, {"interpreter": path}), Context(target_pids=[1]), ListConsumer())
    with pytest.raises(TargetError):
        receiver.start()
    assert receiver.bpf is None
    receiver.shutdown()
    receiver.shutdown()


def test_the_debian_interpreter_has_both_probes_with_semaphores(bpf_ready: None) -> None:
    sites = find_sites(PYTHON)
    for name in ("function__entry", "function__return"):
        site = sites[name]
        assert site.offset > 0 and site.semaphore_offset > 0 and len(site.args) == 3
