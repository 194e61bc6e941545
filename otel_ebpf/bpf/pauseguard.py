"""The pause guard: no state of the agent can hold a process stopped by ``pause_on_load`` for
longer than ``service.pause_timeout`` (default 2 s).

``pause_on_load`` stops (SIGSTOP, from the BPF program at the library's openat) a traced
process until the agent has attached its probes and sent SIGCONT. Two mechanisms bound that
stop whatever the agent does (design and failure table: docs/reliability.md, "The pause
guard"):

* **Leases, in the kernel.** A BPF array map per agent (``oe_pause_guard``,
  otel_ebpf/bpf/include/common.bpf.c) holds CLOCK_MONOTONIC deadlines: slot 0 is renewed by the
  supervisor (below) every tick, slot N by the poll loop of the receiver that owns it, the
  thread that attaches and resumes. The program stops a process only while both leases are
  current; otherwise the process runs on, its probes attach while it runs, and the skip is
  counted (``otel_ebpf.pauses.skipped{receiver, reason=agent_late|guard_late}``). A stopped,
  hung, starved, debugged or dying agent (or supervisor) therefore stops making stops within
  one lease (``pause_timeout / 2``).
* **No stop while throttled.** The supervisor holds slot 0 at ``THROTTLED`` while its cgroup
  (the agent's, i.e. the pod's CPU limit) has been CPU-throttled within the last lease
  (otel_ebpf/bpf/cputhrottle.py): a throttled group was measured standing still 2.6 s, longer
  than any resume it could promise (``reason=cpu_throttled``).
* **The supervisor** (otel_ebpf/bpf/guardsupervisor.py), a separate small process
  (``python -m otel_ebpf.bpf.pauseguard``, standard library and otel_ebpf.bpf.paused only, no
  BCC) in its own session, so a SIGSTOP/SIGINT to the agent's process group or terminal does not
  reach it. Every tick it SIGCONTs each process
  recorded in the agent's ``oe_paused`` maps (pinned on bpffs) that has been stopped longer
  than ``pause_timeout`` (same process, still stopped: otel_ebpf.bpf.paused.resume) and removes
  its entry; the agent later finds the entry gone and counts ``otel_ebpf.pauses.timed_out``.
  When the agent exits (pidfd), the supervisor revokes every lease (its programs, still
  attached while the kernel releases them, make no stop after that), resumes every recorded
  stop, removes the agent's pins and exits.

What is left: a stop made just before the agent's cgroup starts to stall is held until the
supervisor runs again; the agent and its supervisor frozen together (the cgroup freezer, ``docker
pause``) holds the processes stopped in the last lease before the freeze until the thaw; both
SIGKILLed together (an OOM kill of their cgroup) leaves them to the next agent's
:func:`otel_ebpf.bpf.paused.recover_stale`.

Agent side: :func:`acquire` (one guard per agent Context, reference counted; the first call
makes the map, pins it and starts the supervisor), :meth:`PauseGuard.renew`/``revoke`` (poll
loops), :func:`unpin` (once every program is loaded), :func:`release`. Thread-safe; never
raises: a guard that cannot be made leaves the lease slots empty, i.e. no process is ever
stopped, and says so once.
"""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time

from otel_ebpf.bpf import syscalls as bpfsys
from otel_ebpf.bpf.guardsupervisor import LEASE_KEY, LEASE_VALUE, GUARD_DIR, SLOTS, THROTTLED, now_ns, main
from otel_ebpf.bpf.paused import owner_alive, process_stat
from otel_ebpf.bpf.threadctx import ensure_bpffs

__all__ = ["GUARD_DIR", "SLOTS", "THROTTLED", "PauseGuard", "acquire", "health", "main", "release", "unpin"]

log = logging.getLogger(__name__)
_READY_S = 5.0  # longest acquire() waits for the supervisor's first lease
_RESPAWN_EVERY_S = 10.0
_lock = threading.Lock()
_guards: dict[int, PauseGuard] = {}
_refs: dict[int, int] = {}


class PauseGuard:
    """One agent's guard map and supervisor. ``renew``/``revoke`` may be called from any
    thread (one bpf(2) call each, never blocks); the rest under the module lock."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.lease_ns = max(int(timeout * 1e9) // 2, 100_000_000)
        self.fd: int | None = None
        self.pin: str | None = None
        self.supervisor: subprocess.Popen[bytes] | None = None
        st = process_stat(os.getpid())
        self._agent = f"{os.getpid()}-{st[1] if st else 0}"  # pid and start ticks: names it for good
        self._next_slot = 1
        self._respawned_at = 0.0
        self._renewed: dict[int, int] = {}  # slot -> when its lease was last written (now_ns)

    # ---- made by acquire() -----------------------------------------------------------
    def _open(self) -> None:
        ensure_bpffs()
        GUARD_DIR.mkdir(parents=True, exist_ok=True)
        _remove_stale_pins()
        self.fd = bpfsys.map_create(bpfsys.ARRAY, LEASE_KEY.size, LEASE_VALUE.size, SLOTS)
        pin = GUARD_DIR / f"{self._agent}-{id(self):x}"
        bpfsys.obj_pin(self.fd, str(pin))
        self.pin = str(pin)
        self._spawn()
        deadline = time.monotonic() + _READY_S
        while self._read(0) == 0 and time.monotonic() < deadline and self.supervisor_alive():
            time.sleep(0.01)
        if self._read(0) == 0:
            log.warning("pause guard: the supervisor did not start within %.0fs: no process will be stopped "
                        "by pause_on_load (its first library calls may be missed)", _READY_S)

    def _spawn(self) -> None:
        pid, start = self._agent.split("-")
        argv = [sys.executable, "-m", "otel_ebpf.bpf.pauseguard", "--agent-pid", pid, "--agent-start", start,
                "--guard-fd", str(self.fd),
                "--timeout", repr(self.timeout), "--lease-ns", str(self.lease_ns)]
        try:
            self.supervisor = subprocess.Popen(argv, pass_fds=(self.fd,) if self.fd is not None else (),
                                               start_new_session=True, stdin=subprocess.DEVNULL,
                                               stdout=subprocess.DEVNULL)
        except OSError as exc:
            log.warning("pause guard: cannot start its supervisor (%s): no process will be stopped by "
                        "pause_on_load", exc)
            self.supervisor = None

    # ---- receivers -------------------------------------------------------------------
    def new_slot(self) -> int:
        """A lease slot for one program's poll loop (``-DOE_GUARD_SLOT``)."""
        with _lock:
            slot = self._next_slot
            self._next_slot = min(self._next_slot + 1, SLOTS - 1)  # shared beyond 63 programs
        return slot

    def renew(self, slot: int) -> None:
        """The poll loop of ``slot`` is alive: its program may stop processes for one lease more.
        Restarts a dead supervisor (at most every 10 s). Never raises. A loop turns hundreds of
        times a second under load: the lease is written (a bpf(2) call) and the supervisor checked
        at most every eighth of a lease, so it always has 7/8 of a lease or more left."""
        now = now_ns()
        if now - self._renewed.get(slot, -self.lease_ns) < self.lease_ns // 8:
            return
        self._renewed[slot] = now
        self._write(slot, now + self.lease_ns)
        if self.supervisor is not None and self.supervisor.poll() is not None:
            mono = time.monotonic()
            if mono - self._respawned_at >= _RESPAWN_EVERY_S:
                self._respawned_at = mono
                log.warning("pause guard: its supervisor (pid %d) exited with %s; restarting it",
                            self.supervisor.pid, self.supervisor.returncode)
                self._spawn()

    def revoke(self, slot: int) -> None:
        """No more stops by the program of ``slot`` (at shutdown, before it resumes what is left)."""
        self._renewed.pop(slot, None)  # a renew after this writes at once
        self._write(slot, 0)

    def supervisor_alive(self) -> bool:
        return self.supervisor is not None and self.supervisor.poll() is None

    def _write(self, slot: int, value: int) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                bpfsys.update(self.fd, LEASE_KEY.pack(slot), LEASE_VALUE.pack(value))

    def _read(self, slot: int) -> int:
        if self.fd is None:
            return 0
        try:
            raw = bpfsys.lookup(self.fd, LEASE_KEY.pack(slot), LEASE_VALUE.size)
        except OSError:
            return 0
        return LEASE_VALUE.unpack(raw)[0] if raw else 0

    def read_lease(self) -> int:
        """Slot 0 as the supervisor last wrote it (a deadline, THROTTLED, or 0)."""
        return self._read(0)

    def unpin(self) -> None:
        if self.pin is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.pin)
            self.pin = None

    def close(self) -> None:
        """Stop the supervisor (SIGTERM, then SIGKILL after 2 s), close the map. The programs must
        be detached first and their stops resumed (BpfReceiver.shutdown)."""
        for slot in range(SLOTS):
            self._write(slot, 0)
        sup, self.supervisor = self.supervisor, None
        if sup is not None and sup.poll() is None:
            sup.terminate()
            try:
                sup.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                sup.kill()
                sup.wait(timeout=2.0)
        self.unpin()
        bpfsys.close(self.fd)
        self.fd = None


def _remove_stale_pins() -> None:
    """Guard pins of agents that died before their programs were loaded (both the agent and its
    supervisor killed: otherwise the supervisor removes them)."""
    try:
        names = os.listdir(GUARD_DIR)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit() and \
                not owner_alive(int(parts[0]), int(parts[1])):
            with contextlib.suppress(OSError):
                os.unlink(GUARD_DIR / name)


def acquire(ctx: object, timeout: float) -> PauseGuard:
    """The guard of ``ctx`` (one per agent), made on first use; pair with :func:`release`."""
    with _lock:
        guard = _guards.get(id(ctx))
        if guard is None:
            guard = PauseGuard(timeout)
            try:
                guard._open()
            except OSError as exc:
                log.warning("pause guard: cannot make its map on %s (%s): no process will be stopped by "
                            "pause_on_load (its first library calls may be missed)", GUARD_DIR, exc)
                guard.close()
            _guards[id(ctx)] = guard
        _refs[id(ctx)] = _refs.get(id(ctx), 0) + 1
        return guard


def health(ctx: object) -> tuple[bool, str] | None:
    """(supervisor running, detail) of ``ctx``'s guard; None when no receiver pauses."""
    with _lock:
        guard = _guards.get(id(ctx))
    if guard is None:
        return None
    sup = guard.supervisor
    if sup is not None and sup.poll() is None:
        detail = f"supervisor pid {sup.pid} running; pause_timeout {guard.timeout:g}s"
        if guard.read_lease() == THROTTLED:
            detail += "; no process is stopped now: the agent's cgroup is CPU-throttled"
        return True, detail
    return False, ("supervisor not running: no process is stopped by pause_on_load (first library calls may be "
                   "missed); the agent restarts it at most every 10 s")


def unpin(ctx: object) -> None:
    """Every program of ``ctx`` is loaded: the map's pin is no longer needed."""
    with _lock:
        guard = _guards.get(id(ctx))
        if guard is not None:
            guard.unpin()


def release(ctx: object) -> None:
    """Drop one reference; the last one stops the supervisor and closes the map."""
    with _lock:
        n = _refs.get(id(ctx), 0) - 1
        if n > 0:
            _refs[id(ctx)] = n
            return
        _refs.pop(id(ctx), None)
        guard = _guards.pop(id(ctx), None)
    if guard is not None:
        guard.close()


if __name__ == "__main__":  # the supervisor: python -m otel_ebpf.bpf.pauseguard (guardsupervisor.main)
    sys.exit(main())
