"""Finding and reading the CPU cgroup's throttle count (otel_ebpf/bpf/cputhrottle.py) on cgroup v1
and v2 layouts built in a temporary directory."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.bpf import cputhrottle
from otel_ebpf.bpf.cputhrottle import ThrottleWatch, cpu_stat_paths


def _stat(folder: Path, nr: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cpu.stat"
    path.write_text(f"nr_periods 10\nnr_throttled {nr}\nthrottled_time 5\n")
    return path


def test_v2_group_and_its_ancestors_innermost_first(tmp_path: Path) -> None:
    root = tmp_path / "cg2"
    pod = _stat(root / "kubepods" / "pod1", 0)
    ctr = _stat(root / "kubepods" / "pod1" / "ctr", 0)
    paths = cpu_stat_paths("0::/kubepods/pod1/ctr\n", (str(root), None))
    assert paths == [str(ctr), str(pod)]  # kubepods has no cpu.stat here: skipped, not an error


def test_v1_cpu_hierarchy_is_used_on_a_hybrid_host(tmp_path: Path) -> None:
    v1 = tmp_path / "cpu"
    own = _stat(v1 / "oe-starve", 0)
    top = _stat(v1, 0)
    text = "4:memory:/x\n1:cpu,cpuacct:/oe-starve\n0::/\n"
    assert cpu_stat_paths(text, (str(tmp_path / "unified"), str(v1))) == [str(own), str(top)]


def test_no_cpu_controller_means_nothing_to_read(tmp_path: Path) -> None:
    assert cpu_stat_paths("4:memory:/x\n", (None, None)) == []
    assert cpu_stat_paths("0::/a\n", (str(tmp_path / "absent"), None)) == []


def test_watch_reports_a_rise_of_nr_throttled_in_any_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own, parent = tmp_path / "own", tmp_path / "parent"
    paths = [str(_stat(own, 3)), str(_stat(parent, 7))]
    monkeypatch.setattr(cputhrottle, "cpu_stat_paths", lambda: paths)
    w = ThrottleWatch()
    assert not w.throttled_since_last()  # first read: a baseline
    assert not w.throttled_since_last()
    _stat(parent, 8)  # the pod's limit, not the container's
    assert w.throttled_since_last()
    assert not w.throttled_since_last()
    (own / "cpu.stat").write_text("garbage\n")
    assert not w.throttled_since_last()  # unreadable: never throttled, never raises


def test_this_host_resolves_its_cpu_stat() -> None:
    paths = cpu_stat_paths()
    if not any(Path(p).is_file() for p in ("/sys/fs/cgroup/cpu/cpu.stat", "/sys/fs/cgroup/cpu.stat")):
        assert paths == []
    else:
        assert paths and all(Path(p).name == "cpu.stat" and Path(p).is_file() for p in paths), paths
