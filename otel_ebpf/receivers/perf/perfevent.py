"""perf_event_open(2) through ctypes: counting (not sampling) counters, read with read(2).

Counters are opened per target process with ``inherit`` (children forked later count into the
same counter; reading the parent's fd sums every live and exited child) and ``cpu=-1`` (follow
the task on any CPU), or per CPU with ``pid=-1`` for the whole host. Values are read with
PERF_FORMAT_TOTAL_TIME_ENABLED|RUNNING so multiplexed counters can be scaled.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass

__all__ = ["EVENTS", "EventSpec", "close", "hardware_unsupported", "open_counter", "read_counter"]

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PERF_TYPE_HW_CACHE = 0, 1, 3
_ATTR_SIZE = 128  # PERF_ATTR_SIZE_VER7+; older kernels accept a larger size when the tail is zero
_DISABLED, _INHERIT, _EXCLUDE_HV = 1 << 0, 1 << 1, 1 << 6
_READ_FORMAT = 1 | 2  # TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING
_VALUE = struct.Struct("<QQQ")
_SYSCALL = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331, "riscv64": 241}
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class EventSpec:
    """One perf event: its perf type and config, and whether it needs a hardware PMU."""

    type: int
    config: int
    hardware: bool


EVENTS: dict[str, EventSpec] = {
    "cycles": EventSpec(PERF_TYPE_HARDWARE, 0, True),  # PERF_COUNT_HW_CPU_CYCLES
    "instructions": EventSpec(PERF_TYPE_HARDWARE, 1, True),  # PERF_COUNT_HW_INSTRUCTIONS
    # PERF_COUNT_HW_CACHE_DTLB | OP_READ << 8 | RESULT_MISS << 16
    "dtlb_misses": EventSpec(PERF_TYPE_HW_CACHE, 3 | (0 << 8) | (1 << 16), True),
    "task_clock": EventSpec(PERF_TYPE_SOFTWARE, 1, False),  # PERF_COUNT_SW_TASK_CLOCK, ns
    "context_switches": EventSpec(PERF_TYPE_SOFTWARE, 3, False),  # PERF_COUNT_SW_CONTEXT_SWITCHES
    "cpu_migrations": EventSpec(PERF_TYPE_SOFTWARE, 4, False),  # PERF_COUNT_SW_CPU_MIGRATIONS
}


def open_counter(event: str, pid: int, cpu: int = -1, *, inherit: bool = True) -> int:
    """A counting fd for ``event`` on ``pid`` (-1: every process on ``cpu``). Raises OSError
    (ENOENT/EOPNOTSUPP: no such event on this machine, e.g. no PMU; ESRCH: no such process)."""
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"perf_event_open syscall number unknown for {platform.machine()}")
    spec = EVENTS[event]
    attr = bytearray(_ATTR_SIZE)
    flags = _EXCLUDE_HV | (_INHERIT if inherit and pid != -1 else 0)
    struct.pack_into("<IIQ", attr, 0, spec.type, _ATTR_SIZE, spec.config)
    struct.pack_into("<QQ", attr, 32, _READ_FORMAT, flags)
    buf = (ctypes.c_char * _ATTR_SIZE).from_buffer(attr)
    fd = _libc.syscall(ctypes.c_long(nr), buf, ctypes.c_int(pid), ctypes.c_int(cpu), ctypes.c_int(-1),
                       ctypes.c_ulong(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def read_counter(fd: int) -> tuple[int, int, int]:
    """(value, time_enabled ns, time_running ns)."""
    value, enabled, running = _VALUE.unpack(os.read(fd, _VALUE.size))
    return value, enabled, running


def close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def hardware_unsupported() -> str | None:
    """None when a hardware cycles counter can be opened on this process; else why not."""
    try:
        fd = open_counter("cycles", os.getpid(), inherit=False)
    except OSError as exc:
        why = {errno.ENOENT: "the kernel knows no hardware cycles event (no PMU: typical of virtual machines)",
               errno.EOPNOTSUPP: "the PMU does not support this event here",
               errno.EACCES: "permission denied (needs CAP_PERFMON or perf_event_paranoid <= 1)",
               errno.EPERM: "permission denied (needs CAP_PERFMON or perf_event_paranoid <= 1)"}
        detail = why.get(exc.errno or 0, exc.strerror or str(exc))
        code = errno.errorcode.get(exc.errno or 0, "?")
        return f"perf_event_open(PERF_COUNT_HW_CPU_CYCLES) failed with {code}: {detail}"
    close(fd)
    return None
