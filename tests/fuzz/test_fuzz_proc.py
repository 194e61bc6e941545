"""Hostile /proc content for :func:`otel_ebpf.host.processes.process_attributes` (it takes
``proc_root=``): control characters and invalid UTF-8 in comm, cmdline and environ, a 10 MB
command line, missing files, a pid that vanishes between reads. Contract: never raises; every
string value is bounded and free of control characters; secrets in argv are redacted."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from otel_ebpf.host import processes as resources
from otel_ebpf.host.processes import MAX_COMMAND_LINE_CHARS, MAX_VALUE_CHARS, ResourceCache, process_attributes

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069]")
PID = 4242
FILES = ("stat", "cmdline", "environ", "status", "cgroup")
HOSTILE = st.binary(max_size=300) | st.sampled_from([
    b"\x1b[31mred\x1b[0m", b"\xff\xfe\xfd", "a\u202eb".encode(), b"\x00\x00\x00", b"(x) y (z",
    b"\xe2\x80\xae", b"--password=\x01hunter2", b"RANK=\xff1", b"1 (a) R 1"])


def _stat(comm: bytes, ppid: bytes = b"1", start: bytes = b"777") -> bytes:
    rest = [b"R", ppid] + [b"0"] * 17 + [start] + [b"0"] * 20
    return b"%d (%s) " % (PID, comm) + b" ".join(rest)


def _check(attrs: dict) -> None:
    assert attrs["process.pid"] == PID
    for key, value in attrs.items():
        for item in (value if isinstance(value, tuple) else (value,)):
            if isinstance(item, str):
                assert not CONTROL.search(item), (key, item)
                cap = MAX_COMMAND_LINE_CHARS if key == "process.command_line" else MAX_VALUE_CHARS
                assert len(item) <= cap, (key, len(item))
    args = attrs.get("process.command_args", ())
    assert sum(len(a) for a in args) <= MAX_COMMAND_LINE_CHARS + MAX_VALUE_CHARS


def _write(root: Path, files: dict[str, bytes], exe: str | None) -> None:
    d = root / str(PID)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    if exe is not None:
        (d / "exe").symlink_to(exe)


@given(comm=HOSTILE, cmdline=HOSTILE, environ=HOSTILE, status=HOSTILE, cgroup=HOSTILE,
       present=st.sets(st.sampled_from(FILES)), exe=st.none() | st.text(max_size=80).map(lambda t: "/x/" + t))
def test_hostile_proc_files_give_bounded_clean_attributes(tmp_path_factory, comm, cmdline, environ, status,
                                                          cgroup, present, exe):
    root = tmp_path_factory.mktemp("proc")
    contents = {"stat": _stat(comm.replace(b")", b"")) if b"(" not in comm else comm, "cmdline": cmdline,
                "environ": environ, "status": status, "cgroup": cgroup}
    try:
        _write(root, {k: v for k, v in contents.items() if k in present}, exe.replace("\0", "") if exe else None)
    except (OSError, ValueError):
        return  # a name the filesystem refuses cannot appear in /proc either
    _check(process_attributes(PID, proc_root=str(root), fallback_comm="fall\x07back"))


def test_ten_megabyte_command_line_is_read_capped(tmp_path):
    big = b"python\0train.py\0" + b"--lr=0.1\0" * (10 * 1024 * 1024 // 9) + b"--api-key\0s3cr3t\0"
    _write(tmp_path, {"stat": _stat(b"python"), "cmdline": big, "environ": b"RANK=3\0"}, "/usr/bin/python3")
    attrs = process_attributes(PID, proc_root=str(tmp_path))
    _check(attrs)
    assert attrs["process.command_line"].startswith("python train.py --lr=0.1")
    assert attrs["ml.rank"] == 3 and attrs["process.executable.name"] == "python3"


def test_secrets_with_hidden_control_characters_are_still_redacted(tmp_path):
    argv = b"\0".join([b"job", b"--pass\x01word=hunter2", b"--api-key", b"k\x1bey123",
                       b"https://u:pw\x7fd@host/x", b"AWS_SECRET_ACCESS_KEY=abc\x02def"]) + b"\0"
    _write(tmp_path, {"stat": _stat(b"job"), "cmdline": argv}, None)
    line = process_attributes(PID, proc_root=str(tmp_path))["process.command_line"]
    for secret in ("hunter2", "key123", "pwd", "abcdef"):
        assert secret not in line, line
    assert line.count("<redacted>") == 4, line


def test_pid_vanishing_between_reads_gives_only_vanished_attributes(tmp_path, monkeypatch):
    _write(tmp_path, {"stat": _stat(b"short"), "cmdline": b"short\0--x\0", "environ": b"RANK=1\0"}, None)
    real_read = resources._read
    calls = {"n": 0}

    def vanishing(proc_root: str, pid: int, name: str, limit: int = 65536):
        calls["n"] += 1
        if calls["n"] == 2:  # after the first stat read: the process exits
            shutil.rmtree(tmp_path / str(PID))
        return real_read(proc_root, pid, name, limit)

    monkeypatch.setattr(resources, "_read", vanishing)
    attrs = process_attributes(PID, proc_root=str(tmp_path), fallback_comm="short")
    assert set(attrs) <= {"process.pid", "host.name", "process.executable.name", "service.name"}, attrs
    assert ResourceCache(4, proc_root=str(tmp_path)).get(PID, "gone")["process.executable.name"] == "gone"


def test_pid_reused_between_reads_does_not_mix_two_processes(tmp_path, monkeypatch):
    _write(tmp_path, {"stat": _stat(b"old"), "cmdline": b"old\0--token\0t0k\0", "environ": b"RANK=1\0"}, None)
    real_read = resources._read
    calls = {"n": 0}

    def reused(proc_root: str, pid: int, name: str, limit: int = 65536):
        calls["n"] += 1
        if name == "stat" and calls["n"] > 1:  # the second stat read sees another process
            (tmp_path / str(PID) / "stat").write_bytes(_stat(b"new", start=b"999"))
        return real_read(proc_root, pid, name, limit)

    monkeypatch.setattr(resources, "_read", reused)
    attrs = process_attributes(PID, proc_root=str(tmp_path))
    assert "ml.rank" not in attrs and "process.command_line" not in attrs, attrs
