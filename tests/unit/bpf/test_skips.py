"""otel_ebpf.bpf.skips: the growth of each program's recursion_misses between reads."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_ebpf.bpf import skips
from otel_ebpf.bpf.skips import ProgramSkips, recursion_misses


def test_a_file_that_is_not_a_program_has_no_count(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_CREAT | os.O_RDONLY)
    try:
        assert recursion_misses(fd) is None
    finally:
        os.close(fd)
    assert recursion_misses(fd) is None  # closed


def test_growth_per_program_between_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    counts: dict[int, int | None] = {3: 0, 4: 2, 5: None}
    monkeypatch.setattr(skips, "recursion_misses", lambda fd: counts[fd])
    s = ProgramSkips()
    # a program first read counts from 0: it was loaded by this receiver
    assert s.read([("a", 3), ("b", 4), ("c", 5)]) == [("b", 2)]
    assert s.read([("a", 3), ("b", 4), ("c", 5)]) == []
    counts[3], counts[4] = 5, 3
    assert s.read([("a", 3), ("b", 4), ("c", 5)]) == [("a", 5), ("b", 1)]
    counts[4] = 1  # never less than what was counted
    assert s.read([("b", 4)]) == []
    counts[4] = 4
    assert s.read([("b", 4)]) == [("b", 1)]
