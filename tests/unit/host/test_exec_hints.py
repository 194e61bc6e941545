"""ResourceCache.hint (otel_ebpf.host.exec_hints): what the kernel reported of a fork or exec fills the
resource of a process whose /proc could not be read in time, and nothing else."""
from __future__ import annotations

import re
import time
from pathlib import Path

from otel_ebpf.host import processes as r
from otel_ebpf.host.exec_hints import ExecHints

from tests.unit.host.test_resources import _assert_clean_and_capped, make_proc

CMD, ARGS, PATH, NAME, PPID = ("process.command_line", "process.command_args", "process.executable.path",
                               "process.executable.name", "process.parent_pid")


def _now() -> int:
    return time.monotonic_ns()


def test_a_vanished_process_gets_the_kernel_argv_executable_and_parent(tmp_path: Path) -> None:
    cache = r.ResourceCache(proc_root=str(tmp_path))
    assert CMD not in cache.get(40, "true")  # no hint, no /proc: the fallback only
    cache.hint(40, _now(), ppid=7)
    cache.hint(40, _now(), filename="/bin/true", argv=["/bin/true", "-x"])
    a = cache.get(40, "sh")  # the record's comm is stale (the parent's, before the exec)
    assert a[CMD] == "/bin/true -x" and a[ARGS] == ("/bin/true", "-x")
    assert a[PATH] == "/bin/true" and a[NAME] == "true" and a["service.name"] == "true" and a[PPID] == 7
    assert a["process.pid"] == 40 and "process.owner" not in a  # nothing /proc-only is made up
    assert cache.environment(40) is None  # a hint holds no environment


def test_proc_wins_over_the_hint(tmp_path: Path) -> None:
    cache = r.ResourceCache(proc_root=str(tmp_path))
    cache.hint(41, _now(), ppid=3)
    cache.hint(41, _now(), filename="/usr/bin/python3", argv=["python3", "kernel-copy.py"])
    d = make_proc(tmp_path, 41, ppid=5, exe="/opt/py/bin/python3")  # read after the exec
    a = cache.get(41)
    assert a[CMD] == "python train.py" and a[PATH] == "/opt/py/bin/python3" and a[PPID] == 5
    (d / "stat").unlink()  # exited: the entry read while it lived is still served, not the hint
    assert cache.get(41)[CMD] == "python train.py"


def test_a_proc_read_from_before_the_exec_yields_its_program_to_the_hint(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 42, comm="sh", ppid=9, cmdline=b"sh\0-c\0loop\0", exe="/bin/dash")
    cache = r.ResourceCache(proc_root=str(tmp_path))
    assert cache.get(42)[CMD] == "sh -c loop"  # read at the fork, before the child exec'd
    cache.hint(42, _now(), filename="/bin/true", argv=["/bin/true"])
    (d / "stat").unlink()  # gone before any receiver's refresh could read it
    a = cache.get(42)
    assert a[CMD] == "/bin/true" and a[PATH] == "/bin/true" and a[NAME] == "true" and a["service.name"] == "true"
    assert a[PPID] == 9 and a["process.owner"] == "root"  # what an exec keeps is still /proc's


def test_a_zombie_read_gets_only_the_gaps_filled(tmp_path: Path) -> None:
    make_proc(tmp_path, 43, comm="true", ppid=8, cmdline=b"")  # exited, not yet reaped: no argv, no exe
    cache = r.ResourceCache(proc_root=str(tmp_path))
    cache.hint(43, _now(), ppid=99, filename="/bin/true", argv=["/bin/true"])
    a = cache.get(43)
    assert a[CMD] == "/bin/true" and a[PATH] == "/bin/true"
    assert a[PPID] == 8 and a[NAME] == "true"  # /proc's, not the hint's


def test_the_hint_is_redacted_and_capped_as_proc_content_is(tmp_path: Path) -> None:
    argv = ["tool", "--password=hunter2", "--api-key", "sk-\x01abc", "https://u:pw@h/x", "sh", "-c",
            "run --token t1 && HF_TOKEN=x go", "A" * 9000, *["--flag"] * 2000]
    make_proc(tmp_path, 44, cmdline=b"\0".join(a.encode() for a in argv) + b"\0")
    from_proc = r.process_attributes(44, proc_root=str(tmp_path))
    cache = r.ResourceCache(proc_root=str(tmp_path / "empty"))
    cache.hint(44, _now(), filename="/bin/tool\x1b[31m" + "d/" * 500, argv=argv)
    a = cache.get(44)
    assert a[CMD] == from_proc[CMD] and a[ARGS] == from_proc[ARGS]  # one function for both sources
    text = repr(a)
    assert not re.search("hunter2|sk-|:pw@|t1 |HF_TOKEN=x", text) and "<redacted>" in text
    _assert_clean_and_capped(a)
    assert str(a[PATH]).startswith("/bin/tool[31m")


def test_a_reused_pid_never_gets_the_earlier_process_hint(tmp_path: Path) -> None:
    cache = r.ResourceCache(proc_root=str(tmp_path))
    cache.hint(45, _now(), filename="/bin/secret-tool", argv=["/bin/secret-tool"])
    cache.hint(45, _now(), ppid=2)  # a fork: pid 45 is another process now, which never exec'd
    a = cache.get(45, "sh")
    assert CMD not in a and PATH not in a and a[NAME] == "sh" and a[PPID] == 2
    assert cache.hints.stale == 1
    # a process read in /proc that started after the hint's exec is another one too
    boot_offset = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()
    cache.hint(46, 5_000_000_000, filename="/bin/old", argv=["/bin/old"])  # 5 s after boot
    start_ticks = (5_000_000_000 + boot_offset) // 10_000_000 + 100  # a second later, in 10 ms ticks
    make_proc(tmp_path, 46, comm="new", start=start_ticks, cmdline=b"")
    a = cache.get(46)
    assert CMD not in a and a[NAME] == "new"
    make_proc(tmp_path, 47, comm="new", start=1, cmdline=b"")  # started before the hint: the hinted one
    cache.hint(47, 5_000_000_000, filename="/bin/new", argv=["/bin/new"])
    assert cache.get(47)[CMD] == "/bin/new"


def test_hints_are_bounded_lru_and_evictions_counted() -> None:
    hints = ExecHints(max_entries=3)
    for pid in (1, 2, 3):
        hints.exec(pid, 10, {CMD: str(pid)})
    hints.exec(1, 20, {CMD: "1b"})  # refreshed: 2 is now the oldest
    hints.fork(4, 30, {PPID: 1})
    assert len(hints) == 3 and hints.evictions == 1 and hints.get(2) is None
    one = hints.get(1)
    assert one is not None and one.attrs == {CMD: "1b"} and one.exec_ns == 20
    hints.exec(4, 40, {CMD: "4"})  # the same process's exec keeps its parent and fork time
    four = hints.get(4)
    assert four is not None and four.attrs == {PPID: 1, CMD: "4"} and four.start_ns == 30
    assert r.ResourceCache(max_entries=7).hints.max_entries == 7
