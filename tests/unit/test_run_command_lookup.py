"""``otel-ebpf run -- CMD`` finds CMD as execvp does, before anything is loaded (issue 18)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_ebpf.service.run_cmd import EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, unrunnable


def _file(path: Path, mode: int) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(mode)
    return path


def test_a_command_in_path_runs(tmp_path: Path) -> None:
    _file(tmp_path / "tool", 0o755)
    assert unrunnable("tool", f"/nonexistent{os.pathsep}{tmp_path}") is None


def test_a_name_in_no_path_directory_is_127_and_named(tmp_path: Path) -> None:
    code, message = unrunnable("no-such-tool", str(tmp_path))  # type: ignore[misc]
    assert code == EXIT_NOT_FOUND == 127 and "no-such-tool" in message and "PATH" in message


def test_a_non_executable_file_in_path_is_126(tmp_path: Path) -> None:
    _file(tmp_path / "tool", 0o644)
    code, message = unrunnable("tool", str(tmp_path))  # type: ignore[misc]
    assert code == EXIT_NOT_EXECUTABLE == 126 and str(tmp_path / "tool") in message


def test_an_executable_later_in_path_wins_over_a_non_executable_one(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _file(tmp_path / "a" / "tool", 0o644)
    _file(tmp_path / "b" / "tool", 0o755)
    assert unrunnable("tool", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}") is None


def test_a_path_with_a_slash_is_not_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _file(tmp_path / "tool", 0o755)
    monkeypatch.chdir(tmp_path)
    assert unrunnable("./tool", "/nonexistent") is None
    assert unrunnable(str(tmp_path / "missing"), str(tmp_path))[0] == EXIT_NOT_FOUND  # type: ignore[index]
    assert unrunnable(str(tmp_path), "")[0] == EXIT_NOT_EXECUTABLE  # type: ignore[index]  # a directory


def test_an_empty_path_entry_is_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _file(tmp_path / "tool", 0o755)
    monkeypatch.chdir(tmp_path)
    assert unrunnable("tool", f"/nonexistent{os.pathsep}") is None
    assert unrunnable("tool", "/nonexistent") is not None


def test_no_path_variable_searches_the_default_path() -> None:
    assert unrunnable("sh", None) is None  # os.defpath: /bin:/usr/bin
