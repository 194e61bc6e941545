"""Is this process's cgroup being CPU-throttled (a pod's ``resources.limits.cpu``, ``cpu.max``,
``cpu.cfs_quota_us``)? Read by the pause guard's supervisor (otel_ebpf/bpf/pauseguard.py) every
tick: standard library only.

Why the supervisor asks: it shares the agent's cgroup, so it shares its CPU quota. A throttled
group runs nothing until its quota is refilled, and work done inside the kernel past the quota
(a BPF program load, a burst of uprobe registrations) is paid back from later periods: at 1 % of a
CPU the whole group, the supervisor at nice -20 included, was measured standing still for 2.6 s,
so a process stopped just before was held 4.6 s with ``pause_timeout: 2s``. No process can
promise to resume another within ``pause_timeout`` while its own group is throttled, so the
supervisor allows no new stop until its group (and every ancestor with a limit) has gone a whole
lease without throttling.

cgroup v2: ``nr_throttled`` in ``<group>/cpu.stat``; v1: the same key in the ``cpu`` hierarchy's
``cpu.stat``. The group is found from ``/proc/self/cgroup`` and ``/proc/self/mountinfo`` and
looked up again every ``_RESOLVE_EVERY`` reads (the process may be moved).
"""
from __future__ import annotations

import os

__all__ = ["ThrottleWatch", "cpu_stat_paths"]

_RESOLVE_EVERY = 20


def _mounts() -> tuple[str | None, str | None]:
    """(cgroup v2 mount point, cgroup v1 ``cpu`` hierarchy mount point) from mountinfo."""
    v2 = v1 = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None, None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2" and v2 is None:
            v2 = fields[4]
        elif tail[0] == "cgroup" and "cpu" in tail[2].split(",") and v1 is None:
            v1 = fields[4]
    return v2, v1


def cpu_stat_paths(proc_cgroup: str | None = None, mounts: tuple[str | None, str | None] | None = None) -> list[str]:
    """The ``cpu.stat`` files of this process's CPU cgroup and its ancestors up to the mount's
    root, innermost first; [] when there is no CPU controller to read."""
    if proc_cgroup is None:
        try:
            with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as fh:
                proc_cgroup = fh.read()
        except OSError:
            return []
    v2_mount, v1_mount = mounts if mounts is not None else _mounts()
    rel = mount = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] != "0" and "cpu" in parts[1].split(",") and v1_mount:
            rel, mount = parts[2], v1_mount  # v1 first: a hybrid host's v2 tree has no cpu controller
            break
        if parts[0] == "0" and parts[1] == "" and v2_mount:
            rel, mount = parts[2], v2_mount
    if rel is None or mount is None:
        return []
    out = []
    path = os.path.normpath(os.path.join(mount, rel.lstrip("/")))
    while True:
        stat = os.path.join(path, "cpu.stat")
        if os.path.exists(stat):
            out.append(stat)
        if path == mount or len(path) <= len(mount):
            break
        path = os.path.dirname(path)
    return out


def _nr_throttled(path: str) -> int | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == "nr_throttled":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


class ThrottleWatch:
    """``throttled_since_last()``: True when any CPU cgroup holding this process (its own or an
    ancestor) was throttled since the previous call. Never raises; a host without a readable
    ``cpu.stat`` is never throttled."""

    def __init__(self) -> None:
        self._paths: list[str] = []
        self._seen: dict[str, int] = {}
        self._reads = 0

    def throttled_since_last(self) -> bool:
        if self._reads % _RESOLVE_EVERY == 0:
            self._paths = cpu_stat_paths()
        self._reads += 1
        throttled = False
        for path in self._paths:
            n = _nr_throttled(path)
            if n is None:
                continue
            before = self._seen.get(path)
            self._seen[path] = n
            if before is not None and n > before:
                throttled = True
        return throttled
