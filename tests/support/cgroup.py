"""Real cgroups for tests: a CPU-limited one for fault tests (a pod's CPU limit set far too low),
and one whose path names a Kubernetes pod, as the kubelet's cgroupfs driver lays it out."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["CpuCgroup", "PodCgroup"]


class CpuCgroup:
    """A CPU-limited cgroup (v2 cpu.max or v1 cpu.cfs_quota_us), removed on exit."""

    def __init__(self, name: str) -> None:
        root = Path("/sys/fs/cgroup")
        self.v2 = (root / "cgroup.controllers").exists() and "cpu" in (root / "cgroup.controllers").read_text().split()
        if self.v2:
            if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
                (root / "cgroup.subtree_control").write_text("+cpu")
            self.path = root / name
        elif (root / "cpu" / "cpu.cfs_quota_us").exists():
            self.path = root / "cpu" / name
        else:
            pytest.fail("no cgroup cpu controller (neither v2 nor v1) on this host")
        self.path.mkdir(exist_ok=True)

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def limit(self, percent: float | None) -> None:
        period = 100_000
        if self.v2:
            (self.path / "cpu.max").write_text("max" if percent is None else f"{int(period * percent / 100)} {period}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(period))
            (self.path / "cpu.cfs_quota_us").write_text("-1" if percent is None else str(int(period * percent / 100)))

    def remove(self) -> None:
        self.limit(None)
        parent = self.path.parent
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        try:
            self.path.rmdir()
        except OSError:
            pass


class PodCgroup:
    """``kubepods/besteffort/pod<uid>`` (the kubelet's cgroupfs driver layout) in the v2 hierarchy
    when /sys/fs/cgroup is one, else in the v1 ``pids`` hierarchy; removed on :meth:`remove`, its
    processes moved back to the root. Needs root: skips without it (fails under CI=true)."""

    def __init__(self, uid: str) -> None:
        root = Path("/sys/fs/cgroup")
        base = root if (root / "cgroup.controllers").exists() else root / "pids"
        if not (base / "cgroup.procs").exists():
            pytest.fail(f"no writable cgroup hierarchy (v2 at {root} or v1 pids) on this host")
        if os.geteuid() != 0:
            if os.environ.get("CI"):
                pytest.fail("a pod cgroup needs root in CI")
            pytest.skip("needs root to create a pod cgroup")
        self.root = base
        qos = base / "kubepods" / "besteffort"
        self.dirs = [qos.parent, qos, qos / f"pod{uid}"]
        for d in self.dirs:
            d.mkdir(exist_ok=True)
        self.path = self.dirs[-1]

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        for d in reversed(self.dirs):
            for pid in (d / "cgroup.procs").read_text().split() if d.exists() else ():
                try:
                    (self.root / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            try:
                d.rmdir()
            except OSError:
                pass  # another test's pod cgroup is still below it
