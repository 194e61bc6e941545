"""otel_ebpf.bpf.paused without loading a program: struct oe_paused (common.bpf.c) == its Python
mirror, the drop slot of a full map, the same-process rule, /proc parsing, and which pins a
starting agent treats as stale (opening a pin is bpf(2) BPF_OBJ_GET: root, hence tests/bpf)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_ebpf.bpf import paused
from otel_ebpf.bpf.loader import COMMON_SRC
from otel_ebpf.bpf.receiver import DROP_REASONS
from otel_ebpf.core.telemetry import Telemetry

pytestmark = pytest.mark.bpf


def test_oe_paused_key_and_value_match_their_mirrors(tmp_path: Path) -> None:
    """struct oe_paused_key / oe_paused (common.bpf.c, whose BCC macros gcc cannot include whole:
    the two structs are cut out) against paused.KEY / paused.VALUE, as gcc lays them out."""
    from tests.support.layout import assert_mirror, measure

    text = COMMON_SRC.read_text()
    structs = [re.search(rf"struct {name} \{{.*?\}};", text, re.S) for name in ("oe_paused_key", "oe_paused")]
    assert all(structs)
    (tmp_path / "paused.h").write_text("\n".join(m.group(0) for m in structs if m) + "\n")
    c = measure(tmp_path, "paused.h", tmp_path,
                structs={"oe_paused_key": ["tgid", "ts"], "oe_paused": ["boot_ns", "ts"]})
    assert_mirror(c, "oe_paused_key", paused.KEY, ["tgid", "ts"])
    assert_mirror(c, "oe_paused", paused.VALUE, ["boot_ns", "ts"])


def test_full_paused_map_has_its_drop_reason() -> None:
    defines = dict(re.findall(r"#define (OE_DROP_\w+) (\d+)", COMMON_SRC.read_text()))
    assert int(defines["OE_DROP_SLOTS"]) == len(DROP_REASONS)
    assert DROP_REASONS[int(defines["OE_DROP_PAUSEDMAP"])] == "paused_map_full"


def test_same_process_started_no_later_than_the_stop() -> None:
    # start time in ticks (100 per second) rounds down, so a process started at 1.005 s shows 100
    assert paused.is_same_process(100, 1_000_000_000, ticks_per_s=100)
    assert paused.is_same_process(100, 1_004_000_000, ticks_per_s=100)
    assert not paused.is_same_process(101, 1_005_000_000, ticks_per_s=100)  # started after: a reused pid
    assert not paused.is_same_process(100, 999_999_999, ticks_per_s=100)


def test_process_stat_reads_state_and_start_time_of_odd_names(tmp_path: Path) -> None:
    odd = tmp_path / "a (b) c"
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"])
    try:
        before = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        st = paused.process_stat(child.pid)
        # alive and not stopped: R or S, or D while it still pages in its executable (seen under load in CI)
        assert st is not None and st[0] in ("R", "S", "D"), st
        assert paused.is_same_process(st[1], before)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while (st := paused.process_stat(child.pid)) is not None and st[0] != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert st is not None and st[0] == "T"
    finally:
        child.kill()
        child.wait()
    assert paused.process_stat(child.pid) is None


def test_starting_agent_leaves_pins_of_live_agents_and_foreign_names(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paused, "PAUSED_DIR", tmp_path)
    st = paused.process_stat(os.getpid())
    assert st is not None
    live = tmp_path / f"cuda-{os.getpid()}-{st[1]}-1"  # this process: alive
    foreign = tmp_path / "not-ours"
    reused = tmp_path / f"nccl-{os.getpid()}-{st[1] + 1}-1"  # our pid, another start time: a dead agent
    for p in (live, foreign, reused):
        p.write_text("")
    tel = Telemetry()
    # the dead agent's pin is no BPF map here: it cannot be opened, so it is left in place with a warning
    assert paused.recover_stale(tel) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (live, foreign, reused))
    assert tel.get(paused.RECOVERED) == 0


_SYS_EXIT = {"x86_64": 60, "aarch64": 93}  # exit(2) of the calling thread only, not exit_group


def test_pin_of_a_zombie_agent_is_stale_only_once_its_threads_are_gone(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    nr = _SYS_EXIT.get(os.uname().machine)
    if nr is None:
        pytest.skip(f"exit(2)'s number on {os.uname().machine} is not known here")
    # the main thread exits alone (as a SIGKILLed agent's leader does while a thread releases its uprobes)
    tearing = subprocess.Popen([sys.executable, "-c", "import ctypes, threading, time\n"
                                "threading.Thread(target=time.sleep, args=(60,)).start()\n"
                                f"ctypes.CDLL(None).syscall({nr}, 0)\n"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                (a := paused.process_stat(tearing.pid)) and a[0] == "Z" and a[2] == 2
                and (b := paused.process_stat(gone.pid)) and b[0] == "Z"):
            time.sleep(0.02)
        a, b = paused.process_stat(tearing.pid), paused.process_stat(gone.pid)
        assert a is not None and a[0] == "Z" and a[2] == 2, a
        assert b is not None and b[0] == "Z" and b[2] == 1, b
        monkeypatch.setattr(paused, "PAUSED_DIR", tmp_path)
        (tmp_path / f"cuda-{tearing.pid}-{a[1]}-1").write_text("")
        (tmp_path / f"cuda-{gone.pid}-{b[1]}-1").write_text("")
        with caplog.at_level("WARNING", logger="otel_ebpf.bpf.paused"):
            assert paused.recover_stale(Telemetry()) == 0
        # only the finished zombie's pin was taken as stale (and, being no BPF map here, left with a warning)
        stale = [r.getMessage() for r in caplog.records if "stale pin" in r.getMessage()]
        assert len(stale) == 1 and f"{tmp_path}/cuda-{gone.pid}-{b[1]}-1 " in stale[0], stale
    finally:
        for p in (tearing, gone):
            p.kill()
            p.wait()
