"""The pause guard's supervisor process (``python -m otel_ebpf.bpf.pauseguard``, started by
:class:`otel_ebpf.bpf.pauseguard.PauseGuard`): renews the supervisor's lease (slot 0), resumes
every stop older than ``pause_timeout``, and cleans up after the agent exits. Design:
otel_ebpf/bpf/pauseguard.py and docs/reliability.md, "The pause guard". Standard library and
otel_ebpf.bpf.{syscalls,paused,cputhrottle,threadctx} only: no BCC.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import struct
import time
from pathlib import Path

from otel_ebpf.bpf import syscalls as bpfsys
from otel_ebpf.bpf.cputhrottle import ThrottleWatch
from otel_ebpf.bpf.paused import PAUSED_DIR, entries, forget_entry, parse_pin, process_stat, resume, stat_fields
from otel_ebpf.bpf.threadctx import BPFFS

__all__ = ["GUARD_DIR", "LEASE_KEY", "LEASE_VALUE", "PF_EXITING", "SLOTS", "THROTTLED", "agent_dying", "guard_pins_of",
           "main", "now_ns", "stat_says_dying"]

log = logging.getLogger("otel_ebpf.bpf.pauseguard")
GUARD_DIR = BPFFS / "otel_ebpf" / "guard"
SLOTS = 64  # OE_GUARD_SLOTS in common.bpf.c; slot 0 is the supervisor's
THROTTLED = 1  # OE_LEASE_THROTTLED: slot 0 while the agent's cgroup is CPU-throttled
LEASE_KEY, LEASE_VALUE = struct.Struct("<I"), struct.Struct("<Q")


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # = bpf_ktime_get_ns()


def guard_pins_of(pid: int, start: int) -> list[Path]:
    try:
        return [GUARD_DIR / n for n in os.listdir(GUARD_DIR) if n.startswith(f"{pid}-{start}-")]
    except OSError:
        return []


PF_EXITING = 0x4  # include/linux/sched.h: set by do_exit() on entry (exit_signals)
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)


def agent_dying(pid: int, start: int) -> bool:
    """The agent ``pid`` (started at ``start`` ticks) is gone or on its way out. A killed agent's
    pidfd turns readable only once its last thread has exited, and that thread first releases
    its fds: ~0.1 s per uprobe, seconds in all. Which thread does it is the scheduler's choice:
    when the main thread is another one, it shows state Z at once; when it is the main thread,
    it shows R or D throughout (seen in CI: 5 s). So a SIGKILL pending on the main thread (not
    yet run) or its PF_EXITING flag (running do_exit) count as dying too."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
        with open(f"/proc/{pid}/status", "rb") as fh:
            status = fh.read().decode(errors="replace")
    except OSError:
        return True
    return stat_says_dying(stat, status, start)


def stat_says_dying(stat: str, status: str, start: int) -> bool:
    """:func:`agent_dying` on the text of /proc/PID/stat and /proc/PID/status."""
    fields = stat_fields(stat)
    try:
        state, flags, started = fields[0], int(fields[6]), int(fields[19])
    except (IndexError, ValueError):
        return True
    if started != start or state in ("Z", "X") or flags & PF_EXITING:
        return True
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")):
            with contextlib.suppress(ValueError):
                if int(line.split(":", 1)[1].strip(), 16) & _SIGKILL_BIT:
                    return True
    return False


class _Supervisor:
    def __init__(self, agent_pid: int, agent_start: int, guard_fd: int, timeout_ns: int, lease_ns: int) -> None:
        self.agent_pid, self.agent_start = agent_pid, agent_start
        self.guard_fd, self.timeout_ns, self.lease_ns = guard_fd, timeout_ns, lease_ns
        self.tick = min(0.1, timeout_ns / 1e9 / 10)
        self.maps: dict[str, int] = {}
        self.stop = False
        self.resumed = 0
        self.cpu = ThrottleWatch()
        self.throttled_until = 0
        self.warned_at = -(1 << 62)

    def renew(self) -> None:
        """Extend slot 0 by one lease, or hold it at THROTTLED while this cgroup has been
        CPU-throttled within the last lease (otel_ebpf/bpf/cputhrottle.py): then no new stop."""
        now = now_ns()
        if self.cpu.throttled_since_last():
            if self.throttled_until <= now:
                self._say_throttled(now)
            self.throttled_until = now + self.lease_ns
        elif self.throttled_until and self.throttled_until <= now:
            self.throttled_until = 0
            log.info("agent pid %d: its cgroup has not been CPU-throttled for %.1fs; pause_on_load stops "
                     "processes again", self.agent_pid, self.lease_ns / 1e9)
        value = THROTTLED if self.throttled_until > now else now + self.lease_ns
        with contextlib.suppress(OSError):
            bpfsys.update(self.guard_fd, LEASE_KEY.pack(0), LEASE_VALUE.pack(value))

    def _say_throttled(self, now: int) -> None:
        level = logging.WARNING if now - self.warned_at >= 60_000_000_000 else logging.INFO
        if level == logging.WARNING:
            self.warned_at = now
        log.log(level, "agent pid %d: its cgroup is CPU-throttled (a CPU limit too low for it): pause_on_load "
                "stops no process until it has not been throttled for %.1fs (counted in "
                "otel_ebpf.pauses.skipped{reason=cpu_throttled}; their first library calls may be missed)",
                self.agent_pid, self.lease_ns / 1e9)

    def _pins(self) -> list[str]:
        try:
            names = os.listdir(PAUSED_DIR)
        except OSError:
            names = []
        mine = []
        for name in names:
            owner = parse_pin(name)
            if owner is not None and owner[1:] == (self.agent_pid, self.agent_start):
                mine.append(name)
        for gone in set(self.maps) - set(mine):
            bpfsys.close(self.maps.pop(gone))
        return mine

    def sweep(self, older_than_ns: int) -> None:
        """Resume every recorded stop older than ``older_than_ns`` and forget it."""
        for name in self._pins():
            fd = self.maps.get(name)
            if fd is None:
                try:
                    fd = self.maps[name] = bpfsys.obj_get(str(PAUSED_DIR / name))
                except OSError:
                    continue
            now = now_ns()
            try:
                stops = entries(fd)
            except OSError:
                continue
            for pid, boot_ns, ts in stops:
                held_ns = now - ts
                if held_ns < older_than_ns:
                    continue
                try:
                    done = resume(pid, boot_ns)
                except OSError as exc:
                    log.warning("cannot resume pid %d: %s", pid, exc)
                    done = False
                with contextlib.suppress(OSError):
                    forget_entry(fd, pid, ts)
                if done:
                    self.resumed += 1
                    log.warning("resumed pid %d (%s), stopped %.1fs by pause_on_load (%s): agent pid %d %s; "
                                "its first library calls are not traced", pid, _comm(pid), held_ns / 1e9,
                                name.rsplit("-", 3)[0], self.agent_pid,
                                "did not attach in time" if older_than_ns else "is gone")

    def run(self) -> int:
        try:
            pidfd = os.pidfd_open(self.agent_pid)
        except OSError as exc:
            log.warning("agent pid %d: %s; exiting", self.agent_pid, exc)
            return 1
        st = process_stat(self.agent_pid)
        if st is None or st[1] != self.agent_start:
            log.warning("agent pid %d is gone (or another process); exiting", self.agent_pid)
            return 1
        agent_gone = False
        while not self.stop:
            self.renew()
            self.sweep(self.timeout_ns)
            try:
                agent_gone = (bool(select.select([pidfd], [], [], self.tick)[0])
                              or agent_dying(self.agent_pid, self.agent_start))
            except InterruptedError:
                continue
            if agent_gone:
                break
        if agent_gone:
            self._after_agent()
        with contextlib.suppress(OSError):
            bpfsys.update(self.guard_fd, LEASE_KEY.pack(0), LEASE_VALUE.pack(0))
        return 0

    def _after_agent(self) -> None:
        """The agent exited. Its programs may stay attached a while (the kernel releases its
        uprobes ~0.1 s each), so first every lease is revoked: from then on they make no stop.
        One tick later (a program that passed its lease check records and stops within
        microseconds) every recorded stop is resumed and the agent's pins removed."""
        for slot in range(SLOTS):
            with contextlib.suppress(OSError):
                bpfsys.update(self.guard_fd, LEASE_KEY.pack(slot), LEASE_VALUE.pack(0))
        time.sleep(self.tick)
        self.sweep(0)
        for name in self._pins():
            with contextlib.suppress(OSError):
                os.unlink(PAUSED_DIR / name)
        for pin in guard_pins_of(self.agent_pid, self.agent_start):
            with contextlib.suppress(OSError):
                os.unlink(pin)
        log.info("agent pid %d exited; %d stopped processes resumed in all, its pins removed",
                 self.agent_pid, self.resumed)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


_NICE = -20


def _raise_priority() -> None:
    """Nice -20: in the agent's cgroup (a pod's CPU limit) the supervisor competes with every
    thread of the agent for the same quota; at nice 0 a starved agent's busy threads crowd out
    its ticks (measured: resumes 0.3 s late at 1 % CPU). Needs CAP_SYS_NICE, which an agent that
    loads BPF programs has; without it the supervisor runs at its inherited priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, _NICE)
    except OSError as exc:
        log.info("cannot raise the supervisor's priority to nice %d (%s); it shares the agent's", _NICE, exc)


def main(argv: list[str] | None = None) -> int:
    """``python -m otel_ebpf.bpf.pauseguard``: started by the agent, never by hand."""
    ap = argparse.ArgumentParser(prog="otel_ebpf.bpf.pauseguard", description=__doc__.split("\n\n")[0])
    ap.add_argument("--agent-pid", type=int, required=True)
    ap.add_argument("--agent-start", type=int, required=True)
    ap.add_argument("--guard-fd", type=int, required=True)
    ap.add_argument("--timeout", type=float, required=True)
    ap.add_argument("--lease-ns", type=int, required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s otel-ebpf pause guard[{os.getpid()}] "
                                                   "%(levelname)s %(message)s")
    _raise_priority()
    sup = _Supervisor(args.agent_pid, args.agent_start, args.guard_fd, int(args.timeout * 1e9), args.lease_ns)

    def _stop(_sig: int, _frame: object) -> None:
        sup.stop = True

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _stop)
    return sup.run()

