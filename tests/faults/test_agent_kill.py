"""The agent killed with SIGKILL (no shutdown code runs): the kernel must take every probe of it
away, the traced command must go on unharmed, and a restarted agent must trace the same process.

Identified by the killed agent's own fds (prog/map/link ids from /proc/PID/fdinfo, perf-event
fds), never by global emptiness: other agents may be running on the host.

The maps of processes its ``pause_on_load`` stopped (one per pausing receiver, pinned under
/sys/fs/bpf/otel_ebpf/paused/) outlive the kill; the agent's pause guard supervisor, which
does not share its fate, resumes what they record and removes them once the dead agent's last
lease has run out, then exits (otel_ebpf/bpf/pauseguard.py). A kill inside that *paused window* is
tests/faults/test_pause_guard.py; the agent and the supervisor killed together,
tests/faults/test_paused_window.py.
A rank killed mid-collective: tests/e2e/test_demo.py::
test_demo_crash_is_reported_as_a_partial_collective_and_a_desync.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from otel_ebpf.bpf.paused import PAUSED_DIR, pinned_map_id
from otel_ebpf.bpf.threadctx import BPFFS
from tests.faults.agentproc import (
    agent,
    bpf_ids,
    loop_cmd,
    perf_event_fds,
    process_state,
    still_loaded,
    uprobe_events_of,
    wait_until,
)
from tests.support.otlp_sink import spans_from_jsonl
from tests.support.uprobe_links import uprobe_links

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(480)]


def _spans_of(out, pid: int) -> list:
    path = out / "traces.jsonl"
    if not path.exists():
        return []
    try:
        return [s for res, _, s in spans_from_jsonl(path) if res.get("process.pid") == pid and s.name == "cudaMemcpy"]
    except (ValueError, json.JSONDecodeError):  # a line being written
        return []


def _uprobe_libraries(pid: int) -> set[str]:
    """Base names of the libraries ``pid`` has uprobes on: its uprobe_multi links (their fdinfo names the path;
    otel_ebpf.bpf.links) and its perf-event uprobes (bpftool perf list, none without bpftool)."""
    found = {Path(link.path).name for link in uprobe_links(pid)}
    tool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    try:
        r = subprocess.run([tool, "-j", "perf", "list"], capture_output=True, text=True, timeout=60)
    except OSError:
        return found
    return found | {e["filename"].rsplit("/", 1)[-1] for e in json.loads(r.stdout or "[]")
                    if e.get("pid") == pid and "filename" in e}


def _paused_pins(agent_pid: int) -> dict[str, int | None]:
    """{pin name: map id} of the paused-process maps agent ``agent_pid`` pinned."""
    try:
        names = [n for n in os.listdir(PAUSED_DIR) if re.fullmatch(rf"[\w.]+-{agent_pid}-\d+-\d+", n)]
    except OSError:
        return {}
    return {n: pinned_map_id(str(PAUSED_DIR / n)) for n in sorted(names)}


def _ours_on_bpffs(agent_pid: int) -> list[str]:
    """Every bpffs path naming ``agent_pid`` other than its paused-process pins."""
    found = []
    for dirpath, dirnames, filenames in os.walk(BPFFS):
        for n in dirnames + filenames:
            if str(agent_pid) in n and not (dirpath == str(PAUSED_DIR) and n in _paused_pins(agent_pid)):
                found.append(os.path.join(dirpath, n))
    return found


def test_agent_sigkill_leaves_no_probes_and_a_restart_traces_the_same_process(bpf_ready, built, cudart, tmp_path):
    cmd = loop_cmd(cudart, tmp_path, nccl=built["stand_in_nccl"], sleep_ms=5, max_s=200)
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    first = agent("--log-level", "info", "run", "--output", str(out1), "--", *cmd, stderr=tmp_path / "agent1.err")
    second = None
    target = 0
    try:
        assert wait_until(lambda: (tmp_path / "pid").exists(), 90), (tmp_path / "agent1.err").read_text()
        target = int((tmp_path / "pid").read_text())
        assert wait_until(lambda: _spans_of(out1, target), 90), "the first agent never traced the loop"
        if shutil.which("bpftool") or shutil.which("/usr/sbin/bpftool"):
            # CUDA and NCCL probes both attached. Not always before the first span: when the library gate
            # let the loop go before NCCL compiled (the starter made no CPU progress for a lease, as on a
            # loaded CI machine: otel_ebpf/bpf/gate.py), NCCL attaches from the loop's maps once it starts
            assert wait_until(lambda: {"libcudart.so.12", "libnccl.so.2"} <= _uprobe_libraries(first.pid), 90), \
                (_uprobe_libraries(first.pid), (tmp_path / "agent1.err").read_text()[-5000:])
        held = bpf_ids(first.pid)
        perf_fds = perf_event_fds(first.pid) + len(uprobe_links(first.pid))
        libs = _uprobe_libraries(first.pid)
        assert held["prog"] and held["map"] and perf_fds > 0, (held, perf_fds)

        # the pinned maps of paused processes of the pausing receivers (cuda, nccl): they outlive a SIGKILL
        pins = _paused_pins(first.pid)
        # and the library gate's, while it still holds the command (otel_ebpf/bpf/gate.py): seen only when the
        # probes are found attached before it let go, as uprobe links are (their fdinfo is read at once)
        kinds = sorted(n.split("-")[0] for n in pins)
        assert kinds in (["cuda", "nccl"], ["cuda", "gate", "nccl"]), pins
        pinned = {i for i in pins.values() if i is not None}
        assert len(pinned) == len(kinds) and pinned <= held["map"], (pins, held["map"])

        t_kill = time.monotonic()
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=240)  # the kernel detaches ~80 uprobes first: ~30 s measured
        # those pins (and their maps) outlive the agent until its supervisor has removed them, nothing else
        assert set(_paused_pins(first.pid)) <= set(pins), _paused_pins(first.pid)
        assert _ours_on_bpffs(first.pid) == []
        assert wait_until(lambda: _paused_pins(first.pid) == {}, 30), _paused_pins(first.pid)
        assert wait_until(lambda: not still_loaded(held)["prog"] and not still_loaded(held)["link"]
                          and still_loaded(held)["map"] <= pinned, 60), still_loaded(held)
        released_s = time.monotonic() - t_kill
        assert uprobe_events_of(first.pid) == []
        # the traced loop goes on: alive, not stopped, not a zombie
        for _ in range(3):
            assert process_state(target) in ("R", "S", "D"), process_state(target)
            time.sleep(0.3)

        second = agent("run", "--pid", str(target), "--output", str(out2), stderr=tmp_path / "agent2.err")
        assert wait_until(lambda: _spans_of(out2, target), 90), (tmp_path / "agent2.err").read_text()
        assert _paused_pins(first.pid) == {}
        assert wait_until(lambda: not any(still_loaded(held).values()), 60), still_loaded(held)
        (tmp_path / "stop").touch()
        assert second.wait(timeout=120) == 0, (tmp_path / "agent2.err").read_text()
        assert bpf_ids(second.pid) == {"prog": set(), "map": set(), "link": set()}  # it exited
        print(f"agent SIGKILL: {len(held['prog'])} progs, {len(held['map'])} maps, {perf_fds} perf-event fds and "
              "uprobe links, "
              f"uprobes on {sorted(libs)}; all released {released_s:.2f}s after the kill; "
              f"restarted agent traced pid {target}: {len(_spans_of(out2, target))} spans")
    finally:
        (tmp_path / "stop").touch()
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=30)
