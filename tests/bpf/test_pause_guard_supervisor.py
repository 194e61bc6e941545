"""The pause guard's supervisor (otel_ebpf/bpf/guardsupervisor.py) against real BPF maps made with
bpf(2) (otel_ebpf/bpf/syscalls.py) and laid out as the programs make them: ``oe_paused`` hash maps
pinned under /sys/fs/bpf/otel_ebpf/paused/ and the ``oe_pause_guard`` lease array. A stand-in
"agent" is a plain child process, so its death can be chosen. Needs root and bpffs (no BCC)."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import time

import pytest

from otel_ebpf.bpf import syscalls as bpfsys
from otel_ebpf.bpf.paused import KEY, PAUSED_DIR, VALUE, entries, process_stat
from otel_ebpf.bpf.guardsupervisor import SLOTS, THROTTLED, _Supervisor
from otel_ebpf.bpf.threadctx import ensure_bpffs
from tests.faults.agentproc import process_state, wait_until
from tests.support.cgroup import CpuCgroup

pytestmark = pytest.mark.bpf

_Q = struct.Struct("<Q")


def _now() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


class _Agent:
    """A stand-in agent process with one pinned oe_paused map and a guard array."""

    def __init__(self) -> None:
        ensure_bpffs()
        PAUSED_DIR.mkdir(parents=True, exist_ok=True)
        self.proc = _sleeper()
        assert wait_until(lambda: process_stat(self.proc.pid) is not None, 5)
        st = process_stat(self.proc.pid)
        assert st is not None
        self.start = st[1]
        self.paused = bpfsys.map_create(bpfsys.HASH, KEY.size, VALUE.size, 64)
        self.pin = PAUSED_DIR / f"cuda-{self.proc.pid}-{self.start}-1"
        bpfsys.obj_pin(self.paused, str(self.pin))
        self.guard = bpfsys.map_create(bpfsys.ARRAY, 4, 8, SLOTS)

    def record(self, pid: int, age_s: float, *, boot_ns: int | None = None) -> int:
        ts = _now() - int(age_s * 1e9)
        boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME) if boot_ns is None else boot_ns
        bpfsys.update(self.paused, KEY.pack(pid, ts), VALUE.pack(boot, ts))
        return ts

    def lease(self, slot: int) -> int:
        raw = bpfsys.lookup(self.guard, struct.pack("<I", slot), 8)
        return _Q.unpack(raw)[0] if raw else 0

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.pin.exists():
            os.unlink(self.pin)
        bpfsys.close(self.paused)
        bpfsys.close(self.guard)


@pytest.fixture
def fake_agent(bpf_ready):
    a = _Agent()
    yield a
    a.close()


def _stopped() -> subprocess.Popen[bytes]:
    p = _sleeper()
    os.kill(p.pid, 19)
    assert wait_until(lambda: process_state(p.pid) == "T", 10, 0.02)
    return p


def test_sweep_resumes_only_stops_older_than_the_timeout_of_the_same_stopped_process(fake_agent):
    old, young, reused, user = _stopped(), _stopped(), _stopped(), _stopped()
    try:
        fake_agent.record(old.pid, 3.0)
        fake_agent.record(young.pid, 0.1)
        fake_agent.record(reused.pid, 3.0, boot_ns=1)  # stopped at boot: before this process existed
        sup = _Supervisor(fake_agent.proc.pid, fake_agent.start, fake_agent.guard, 2_000_000_000, 1_000_000_000)
        sup.sweep(2_000_000_000)
        assert wait_until(lambda: process_state(old.pid) in ("R", "S"), 10, 0.02)
        assert process_state(young.pid) == "T" and process_state(reused.pid) == "T"
        assert process_state(user.pid) == "T"  # never recorded: its user's stop
        left = {pid for pid, _b, _t in entries(fake_agent.paused)}
        assert left == {young.pid}  # the handled entries are forgotten, the young one is the agent's
        assert sup.resumed == 1
    finally:
        for p in (old, young, reused, user):
            p.kill()
            p.wait(timeout=30)


def test_supervisor_renews_its_lease_and_after_the_agent_dies_resumes_everything_and_unpins(fake_agent):
    target = _stopped()
    fake_agent.record(target.pid, 0.0)
    lease_ns = 5_000_000_000
    bpfsys.update(fake_agent.guard, struct.pack("<I", 1), _Q.pack(_now() + lease_ns))  # a poll loop's lease
    sup = subprocess.Popen([sys.executable, "-m", "otel_ebpf.bpf.pauseguard", "--agent-pid", str(fake_agent.proc.pid),
                            "--agent-start", str(fake_agent.start), "--guard-fd", str(fake_agent.guard),
                            "--timeout", "30", "--lease-ns", str(lease_ns)],
                           pass_fds=(fake_agent.guard,), stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert wait_until(lambda: fake_agent.lease(0) > _now(), 10, 0.02), "no supervisor lease"
        time.sleep(1.0)
        assert process_state(target.pid) == "T"  # younger than the 30 s timeout, the agent lives
        assert fake_agent.lease(0) > _now()  # renewed every tick
        fake_agent.proc.kill()
        t_dead = time.monotonic()
        assert wait_until(lambda: process_state(target.pid) in ("R", "S"), 10, 0.02)
        resumed_after = time.monotonic() - t_dead
        assert sup.wait(timeout=10) == 0
        assert not fake_agent.pin.exists()
        assert fake_agent.lease(0) == 0  # no stop can be made any more
        assert resumed_after < 1.0  # at once: the leases revoked, neither they nor the timeout waited for
        assert fake_agent.lease(1) == 0
        err = sup.stderr.read().decode() if sup.stderr else ""
        assert f"resumed pid {target.pid}" in err and "is gone" in err, err
    finally:
        if sup.poll() is None:
            sup.kill()
        target.kill()
        target.wait(timeout=30)


def test_supervisor_exits_without_touching_stops_when_terminated(fake_agent):
    """SIGTERM (the agent's clean shutdown, or anyone): its lease is cleared at once, so the
    programs stop making stops; what is still recorded is the live agent's to resume."""
    target = _stopped()
    fake_agent.record(target.pid, 0.0)
    sup = subprocess.Popen([sys.executable, "-m", "otel_ebpf.bpf.pauseguard", "--agent-pid", str(fake_agent.proc.pid),
                            "--agent-start", str(fake_agent.start), "--guard-fd", str(fake_agent.guard),
                            "--timeout", "30", "--lease-ns", "500000000"], pass_fds=(fake_agent.guard,),
                           start_new_session=True)
    try:
        assert wait_until(lambda: fake_agent.lease(0) > 0, 10, 0.02)
        sup.terminate()
        assert sup.wait(timeout=5) == 0
        assert fake_agent.lease(0) == 0
        assert process_state(target.pid) == "T" and fake_agent.pin.exists()
    finally:
        if sup.poll() is None:
            sup.kill()
        target.kill()
        target.wait(timeout=30)


def test_supervisor_allows_no_stop_while_its_cgroup_is_cpu_throttled(fake_agent):
    """The supervisor and a busy process in a cgroup at 2 % of a CPU: within a few ticks slot 0
    reads THROTTLED (the programs make no stop, counted as cpu_throttled); with the limit lifted
    and the busy process gone, it is a deadline again after one lease."""
    cg = CpuCgroup(f"oe-guard-throttle-{os.getpid()}")
    lease_ns = 500_000_000
    sup = subprocess.Popen([sys.executable, "-m", "otel_ebpf.bpf.pauseguard", "--agent-pid", str(fake_agent.proc.pid),
                            "--agent-start", str(fake_agent.start), "--guard-fd", str(fake_agent.guard),
                            "--timeout", "1", "--lease-ns", str(lease_ns)],
                           pass_fds=(fake_agent.guard,), stderr=subprocess.PIPE, start_new_session=True)
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.monotonic() + 60\n"
                             "while time.monotonic() < end: pass"])
    try:
        assert wait_until(lambda: fake_agent.lease(0) > _now(), 10, 0.02), "no supervisor lease"
        cg.add(sup.pid)
        cg.add(busy.pid)
        cg.limit(2.0)
        assert wait_until(lambda: fake_agent.lease(0) == THROTTLED, 20, 0.05), fake_agent.lease(0)
        busy.kill()
        busy.wait(timeout=30)
        cg.limit(None)
        assert wait_until(lambda: fake_agent.lease(0) > _now(), 10, 0.05), fake_agent.lease(0)
        sup.terminate()
        assert sup.wait(timeout=10) == 0
        err = sup.stderr.read().decode() if sup.stderr else ""
        assert "its cgroup is CPU-throttled" in err and "stops processes again" in err, err
    finally:
        for p in (sup, busy):
            if p.poll() is None:
                p.kill()
        cg.remove()
