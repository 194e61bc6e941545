"""otel_ebpf.host.procfs against real processes: a live one, a zombie, a reaped one; and a
command name that holds spaces and parentheses."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ebpf.host.procfs import fault_count, parent_pid, process_gone, stat_fields


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _state(pid: int) -> bytes:
    fields = stat_fields(pid)
    assert fields is not None
    return fields[0]


def _wait_zombie(pid: int) -> None:
    deadline = time.monotonic() + 10
    while _state(pid) != b"Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)


def test_a_live_process_is_not_gone_and_has_its_parent_and_faults(child: subprocess.Popen[bytes]) -> None:
    assert not process_gone(child.pid)
    assert parent_pid(child.pid) == os.getpid()
    faults = fault_count(child.pid)
    assert faults is not None and faults > 0  # a python interpreter faults pages in to start


def test_a_zombie_is_gone_but_keeps_its_parent(child: subprocess.Popen[bytes]) -> None:
    assert child.stdin is not None
    child.stdin.close()  # the child reads EOF and exits; not waited for, so it stays a zombie
    _wait_zombie(child.pid)
    assert process_gone(child.pid)
    assert fault_count(child.pid) is None
    assert parent_pid(child.pid) == os.getpid()


def test_a_reaped_process_is_gone(child: subprocess.Popen[bytes]) -> None:
    assert child.stdin is not None
    child.stdin.close()
    child.wait()
    assert process_gone(child.pid)
    assert stat_fields(child.pid) is None and parent_pid(child.pid) is None and fault_count(child.pid) is None


def _fake_proc(root: Path, pid: int, line: str) -> str:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "stat").write_text(line)
    return str(root)


def test_fields_are_found_after_the_last_parenthesis_of_the_command(tmp_path: Path) -> None:
    rest = "S 77 " + " ".join(str(n) for n in range(5, 53))  # fields 3, 4, then 5.. hold their own number
    root = _fake_proc(tmp_path, 42, f"42 (a) b (c)) {rest}\n")
    assert not process_gone(42, root)
    assert parent_pid(42, root) == 77
    assert fault_count(42, root) == 10 + 12


@pytest.mark.parametrize("line", ["42 (x) Z 1 0 0", "42 (x) X 1 0 0", "42 (x)", ""])
def test_zombie_dead_and_stateless_lines_read_as_gone(tmp_path: Path, line: str) -> None:
    root = _fake_proc(tmp_path, 42, line)
    assert process_gone(42, root)
    assert fault_count(42, root) is None


def test_a_malformed_line_gives_no_parent_and_no_faults(tmp_path: Path) -> None:
    root = _fake_proc(tmp_path, 42, "42 (x) S notanumber")
    assert parent_pid(42, root) is None and fault_count(42, root) is None
