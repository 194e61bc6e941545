"""The supervisor's "is the agent on its way out" (otel_ebpf.bpf.guardsupervisor.stat_says_dying),
on this process's own /proc text with one field changed at a time. The case it exists for: a
SIGKILLed agent whose main thread is the one releasing its uprobes shows R or D (not Z) for
seconds; the supervisor must resume what it stopped at once all the same."""
from __future__ import annotations

import os
import re

from otel_ebpf.bpf.guardsupervisor import PF_EXITING, agent_dying, stat_says_dying
from otel_ebpf.bpf.paused import process_stat


def _own() -> tuple[str, str, int]:
    stat = open(f"/proc/{os.getpid()}/stat").read()
    status = open(f"/proc/{os.getpid()}/status").read()
    st = process_stat(os.getpid())
    assert st is not None
    return stat, status, st[1]


def _with_field(stat: str, index: int, value: str) -> str:
    """``stat`` with field ``index`` after the comm (0 = state) replaced."""
    head, tail = stat[:stat.rfind(")") + 2], stat[stat.rfind(")") + 2:].split(" ")
    tail[index] = value
    return head + " ".join(tail)


def test_a_live_process_is_not_dying() -> None:
    stat, status, start = _own()
    assert not stat_says_dying(stat, status, start)
    assert not agent_dying(os.getpid(), start)


def test_zombie_other_process_or_gone_is_dying() -> None:
    stat, status, start = _own()
    assert stat_says_dying(_with_field(stat, 0, "Z"), status, start)
    assert stat_says_dying(stat, status, start + 1)  # the pid was reused
    assert agent_dying(2**22 + 7, start)  # no such pid


def test_main_thread_in_do_exit_is_dying_while_it_shows_running() -> None:
    stat, status, start = _own()
    flags = int(stat[stat.rfind(")") + 2:].split()[6])
    exiting = _with_field(_with_field(stat, 0, "R"), 6, str(flags | PF_EXITING))
    assert stat_says_dying(exiting, status, start)
    assert not stat_says_dying(_with_field(stat, 0, "D"), status, start)  # D alone: a busy agent


def test_sigkill_pending_is_dying_before_the_main_thread_runs() -> None:
    stat, status, start = _own()
    for field in ("SigPnd", "ShdPnd"):
        killed = re.sub(rf"^{field}:\s*[0-9a-f]+$", f"{field}:\t0000000000000100", status, flags=re.M)
        assert killed != status
        assert stat_says_dying(stat, killed, start), field
    other = re.sub(r"^SigPnd:\s*[0-9a-f]+$", "SigPnd:\t0000000000004000", status, flags=re.M)  # SIGTERM
    assert not stat_says_dying(stat, other, start)
