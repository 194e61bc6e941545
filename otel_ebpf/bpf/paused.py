"""Processes held stopped by ``pause_on_load``, recorded where they outlive the agent.

A BPF program with ``OE_PAUSE_ON_LOAD=1`` stops (SIGSTOP) a traced process that opens its
library and records the stop (key: tgid and the stop's timestamp, so each delete names one
stop) in the hash map ``oe_paused`` (otel_ebpf/bpf/include/common.bpf.c) before the agent attaches
and sends SIGCONT. The agent's pause guard (otel_ebpf/bpf/pauseguard.py) reads the same records to
resume any stop older than ``pause_timeout``. The map is pinned on bpffs while the agent runs::

    /sys/fs/bpf/otel_ebpf/paused/<receiver>-<agent pid>-<agent start ticks>-<n>

(``<agent start ticks>``: field 22 of /proc/<agent pid>/stat, so a reused agent pid is not
mistaken for the owner; ``<n>``: the receiver instance in that process). A clean shutdown
removes the pin; an agent that died without cleanup (SIGKILL) leaves it to its supervisor,
which resumes what it records and removes it; only when both die together (an OOM kill of
their cgroup) is it left for the next agent (:func:`recover_stale`, called before any program
loads), which resumes every process the dead agent recorded that is still the same process and
still stopped (state T), logs a warning naming it and counts
``otel_ebpf.pauses.recovered{receiver}``, then removes the pin.
A process stopped by anyone else (Ctrl+Z, a debugger, a scheduler's suspend) is never in the
map and is left alone.

Same process: the map value holds ``bpf_ktime_get_boot_ns()`` at the stop. The pid's holder
now started (/proc/PID/stat field 22, CLOCK_BOOTTIME in clock ticks, rounded down) no later
than that stop only if it existed at the stop, i.e. it is the process that was stopped (two
live processes never share a pid). A reused pid started after the stop, unless it was reused
within the same clock tick (10 ms at USER_HZ=100): that needs the pid space to wrap around in
10 ms.

Thread-safe (one lock); never raises: problems are logged with the pin path.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import struct
import threading
from pathlib import Path
from typing import Any

from otel_ebpf.bpf import syscalls as bpfsys
from otel_ebpf.bpf.threadctx import BPFFS, ensure_bpffs

__all__ = [
    "KEY",
    "PAUSED_DIR",
    "RECOVERED",
    "VALUE",
    "entries",
    "forget",
    "forget_entry",
    "hold",
    "is_same_process",
    "map_info",
    "new_pin",
    "owner_alive",
    "parse_pin",
    "pinned_map_id",
    "process_stat",
    "recorded",
    "recover_stale",
    "rekey",
    "release",
    "resume",
    "resume_recorded",
    "stat_fields",
    "stops",
    "unpin",
]

log = logging.getLogger(__name__)
PAUSED_DIR = BPFFS / "otel_ebpf" / "paused"
RECOVERED = "otel_ebpf.pauses.recovered"
#: struct oe_paused (common.bpf.c): u64 boot_ns (bpf_ktime_get_boot_ns at the stop), u64 ts
#: (bpf_ktime_get_ns, the same as the library-open record's ts)
VALUE = struct.Struct("<QQ")
#: struct oe_paused_key: u32 tgid, u32 pad, u64 ts (the stop's library-open record ts)
KEY = struct.Struct("<I4xQ")
_BPF_MAP_TYPE_HASH = 1
_lock = threading.Lock()
_instances = itertools.count(1)
_warned = False


def stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/PID/stat text after the comm (index 0: the state, field 3 of proc(5))."""
    return stat[stat.rfind(")") + 2:].split()  # comm may hold spaces and parentheses


def process_stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, start time in clock ticks since boot, threads) of ``pid``, None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None
    fields = stat_fields(stat)
    try:
        return fields[0], int(fields[19]), int(fields[17])  # fields 3, 22 and 20 of proc(5)
    except (IndexError, ValueError):
        return None


def is_same_process(start_ticks: int, stopped_boot_ns: int, ticks_per_s: int | None = None) -> bool:
    """The process that started at ``start_ticks`` existed when the stop was recorded at
    ``stopped_boot_ns`` (both CLOCK_BOOTTIME), so it is the process that was stopped."""
    hz = ticks_per_s or os.sysconf("SC_CLK_TCK")
    return start_ticks * 1_000_000_000 // hz <= stopped_boot_ns


def owner_alive(pid: int, start_ticks: int) -> bool:
    """The agent that owns a pin may still have programs attached. A SIGKILLed agent shows state Z
    with 2 threads for the ~0.1 s per uprobe the kernel takes to release its fds (observed on
    6.18: Z, 2 threads, /proc/PID/fd unreadable, for as long as the kill's teardown lasts); its
    openat tracepoint may still stop processes meanwhile, so its pin is left until the last
    thread is gone (a zombie with one thread) or the process is reaped."""
    st = process_stat(pid)
    if st is None or st[1] != start_ticks:
        return False
    return st[0] not in ("Z", "X") or st[2] > 1


def new_pin(receiver: str) -> str | None:
    """A fresh pin path for one receiver's ``oe_paused`` map (the folder is made, bpffs mounted
    when needed); None, with one warning, when bpffs cannot be used: pauses then work as before
    but a SIGKILLed agent's stopped processes are not found by the next one."""
    global _warned
    st = process_stat(os.getpid())
    try:
        if st is None:
            raise OSError("cannot read /proc/self/stat")
        with _lock:
            ensure_bpffs()
            PAUSED_DIR.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if not _warned:
            _warned = True
            log.warning("%s: cannot pin the map of paused processes on %s (%s): if the agent is killed while a "
                        "process is stopped by pause_on_load, the next agent will not resume it", receiver,
                        PAUSED_DIR, exc)
        return None
    return str(PAUSED_DIR / f"{receiver}-{os.getpid()}-{st[1]}-{next(_instances)}")


def unpin(path: str | None) -> None:
    """Remove a pin made by :func:`new_pin` (the map lives on while a program or fd holds it)."""
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def map_info(fd: int) -> dict[str, int]:
    """The fdinfo fields of a BPF map fd of this process (map_type, key_size, value_size, map_id...)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
            key, _, value = line.partition(":")
            with contextlib.suppress(ValueError):
                out[key.strip()] = int(value.strip(), 0)
    return out


def entries(fd: int) -> list[tuple[int, int, int]]:
    """(pid, stop boot ns, stop ts) of every entry of an ``oe_paused`` map fd (bpf(2) directly:
    the pause guard's supervisor reads these maps without BCC)."""
    out: list[tuple[int, int, int]] = []
    for key in bpfsys.keys(fd, KEY.size):
        raw = bpfsys.lookup(fd, key, VALUE.size)
        if raw is not None:
            pid, ts = KEY.unpack(key)
            out.append((pid, VALUE.unpack(raw)[0], ts))
    return out


def forget_entry(fd: int, pid: int, ts: int) -> bool:
    """Delete the record of ``pid``'s stop at ``ts`` from ``fd``; True when it was there."""
    return bpfsys.delete(fd, KEY.pack(pid, ts))


def resume(pid: int, boot_ns: int) -> bool:
    """SIGCONT ``pid`` if it is still the process stopped at ``boot_ns`` and still stopped (T)."""
    st = process_stat(pid)
    if st is None or st[0] != "T" or not is_same_process(st[1], boot_ns):
        return False
    os.kill(pid, signal.SIGCONT)
    return True


def resume_recorded(fd: int, receiver: str, *, why: str) -> list[int]:
    """SIGCONT every process recorded in ``fd`` (an ``oe_paused`` map) that is still the same
    process and still stopped (state T); returns their pids. ``why`` ends each log line."""
    resumed = []
    for pid, boot_ns, _ts in entries(fd):
        try:
            if not resume(pid, boot_ns):
                continue
        except OSError as exc:
            log.warning("%s: cannot resume pid %d, stopped by pause_on_load: %s", receiver, pid, exc)
            continue
        resumed.append(pid)
        log.warning("%s: resumed pid %d (SIGCONT): %s", receiver, pid, why)
    return resumed


def parse_pin(name: str) -> tuple[str, int, int] | None:
    parts = name.rsplit("-", 3)
    if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
        return None
    return parts[0], int(parts[1]), int(parts[2])


def recover_stale(telemetry: Any) -> int:
    """Resume the processes left stopped by agents that died without cleanup, and remove their
    pins; returns how many were resumed. Pins of live agents (this one included) are left alone."""
    total = 0
    with _lock:
        try:
            names = sorted(os.listdir(PAUSED_DIR))
        except OSError:
            return 0
        for name in names:
            owner = parse_pin(name)
            if owner is None or owner_alive(owner[1], owner[2]):
                continue
            n = _recover_one(str(PAUSED_DIR / name), owner[0], owner[1])
            if n:
                telemetry.add(RECOVERED, n, receiver=owner[0])
            total += n
    return total


def _recover_one(path: str, receiver: str, agent_pid: int) -> int:
    try:
        fd = bpfsys.obj_get(path)
    except OSError as exc:
        log.warning("%s: cannot open the stale pin %s (%s); remove it by hand after checking for "
                    "stopped processes", receiver, path, exc)
        return 0
    try:
        info = map_info(fd)
        if (info.get("map_type"), info.get("key_size"), info.get("value_size")) != (
                _BPF_MAP_TYPE_HASH, KEY.size, VALUE.size):
            log.warning("%s: %s is not a map of paused processes of this version (%s); left in place",
                        receiver, path, info)
            return 0
        resumed = resume_recorded(fd, receiver, why=f"it was stopped (pause_on_load) by agent pid {agent_pid}, "
                                                    "which died before resuming it")
    finally:
        os.close(fd)
    unpin(path)
    log.info("%s: removed the stale pin %s of agent pid %d", receiver, path, agent_pid)
    return len(resumed)


def _key(table: Any, pid: int, ts: int) -> Any:
    key = table.Key()
    key.tgid, key.ts = pid, ts
    return key


def forget(bpf: Any, pid: int, ts: int | None) -> None:
    """Delete the record of ``pid``'s stop at ``ts`` (None: every stop of ``pid``) from ``bpf``'s
    ``oe_paused``, after the agent's SIGCONT (in this order: an agent killed in between leaves a
    record whose process is no longer stopped, which the next agent skips). Never raises."""
    try:
        table = bpf["oe_paused"]
        keys = [_key(table, pid, ts)] if ts is not None else [k for k in list(table.keys()) if k.tgid == pid]
        for k in keys:
            del table[k]
    except Exception:  # no such map (pause off, no program) or entry (already gone)
        pass


def recorded(bpf: Any, pid: int, ts: int) -> bool:
    """``bpf``'s ``oe_paused`` still records the stop of ``pid`` at ``ts``: nobody (the pause
    guard's supervisor) has resumed it yet. Never raises."""
    try:
        table = bpf["oe_paused"]
        table[_key(table, pid, ts)]
        return True
    except Exception:
        return False


def rekey(bpf: Any, pid: int, ts: int, new_ts: int) -> bool:
    """Record ``pid``'s stop at ``ts`` as made at ``new_ts`` (same value), so the pause guard counts
    its pause_timeout from ``new_ts``: the library gate's way of holding a process longer while the
    agent shows progress (otel_ebpf.bpf.gate). The new record is written before the old one is
    deleted: the guard never sees the stop unrecorded. False (nothing written) when the stop is no
    longer recorded (the guard resumed it). Never raises."""
    try:
        table = bpf["oe_paused"]
        value = table[_key(table, pid, ts)]
        table[_key(table, pid, new_ts)] = value
        del table[_key(table, pid, ts)]
        return True
    except Exception:
        return False


def stops(bpf: Any) -> list[tuple[int, int]]:
    """(pid, ts) of every stop ``bpf``'s ``oe_paused`` records (none when it has no such map)."""
    try:
        return [(k.tgid, k.ts) for k in list(bpf["oe_paused"].keys())]
    except Exception:
        return []


def hold(bpf: Any) -> int | None:
    """A duplicate fd of ``bpf``'s ``oe_paused`` map (None without one), so it can be read after
    ``bpf.cleanup()``: once the programs are detached no process can be stopped any more."""
    try:
        return os.dup(bpf["oe_paused"].map_fd)
    except Exception:
        return None


def release(fd: int | None, pin: str | None, receiver: str) -> None:
    """At a clean shutdown, after the programs are detached: resume what is still recorded
    in ``fd`` (stops the poll thread never read), close it, remove the pin."""
    try:
        if fd is not None:
            resume_recorded(fd, receiver, why="stopped (pause_on_load) after the agent's last read, "
                                              "resumed at shutdown")
    except Exception:
        log.debug("%s: reading the paused map at shutdown failed", receiver, exc_info=True)
    finally:
        if fd is not None:
            os.close(fd)
        unpin(pin)


def pinned_map_id(path: str) -> int | None:
    """The kernel id of the map pinned at ``path`` (None when it cannot be opened)."""
    try:
        fd = bpfsys.obj_get(path)
    except OSError:
        return None
    try:
        return map_info(fd).get("map_id")
    finally:
        os.close(fd)
