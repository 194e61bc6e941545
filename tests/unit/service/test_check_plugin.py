"""`otel-ebpf check`'s NCCL profiler plugin row: built or not, and which running NCCL processes loaded it."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf import nccl_profiler
from otel_ebpf.service.check import INFO, OK, _nccl_plugin


def fake_proc(root: Path, maps: dict[int, list[Path]]) -> str:
    for pid, files in maps.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "maps").write_text("".join(f"7f00{i:04x}000-7f00{i:04x}fff r-xp 00000000 08:01 {i + 1} {f}\n"
                                        for i, f in enumerate(files)))
    return str(root)


def test_the_row_names_the_nccl_processes_that_did_not_load_the_plugin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {name: tmp_path / "lib" / name for name in ("libnccl.so.2", "libnccl-profiler-otel_ebpf.so", "python3")}
    for f in files.values():
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(b"")
    nccl, plugin, python = files.values()
    monkeypatch.setattr(nccl_profiler, "plugin_path", lambda: plugin)
    row = _nccl_plugin(fake_proc(tmp_path / "p1", {10: [nccl, plugin], 11: [nccl], 12: [python]}))
    assert row.status == INFO and "NCCL processes running: 2, with the plugin: 1 (without: 11)" in row.detail
    assert f"NCCL_PROFILER_PLUGIN={plugin}" in row.fix
    row = _nccl_plugin(fake_proc(tmp_path / "p2", {10: [nccl, plugin], 12: [python]}))
    assert row.status == OK and row.detail.endswith("NCCL processes running: 1, with the plugin: 1")


def test_a_plugin_that_is_not_built_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_profiler, "plugin_path", lambda: None)
    row = _nccl_plugin()
    assert row.status == INFO and row.detail == "libnccl-profiler-otel_ebpf.so is not built"
