"""otel_ebpf.core.ids: derived ids agree everywhere."""
from __future__ import annotations

import subprocess
import sys

import pytest

from otel_ebpf.core.ids import derive_id


def test_derive_id_is_stable_across_calls():
    assert derive_id("comm", 7) == derive_id("comm", 7)
    assert derive_id("comm", 7) != derive_id("comm", 8)
    assert derive_id("a", "bc") != derive_id("ab", "c")  # parts are separated


def test_derive_id_is_stable_across_processes():
    code = "from otel_ebpf.core.ids import derive_id; print(derive_id('0xabc', 42), derive_id('x', bits=64))"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert runs == {f"{derive_id('0xabc', 42)} {derive_id('x', bits=64)}\n"}


@pytest.mark.parametrize("bits", [64, 128])
def test_derive_id_width_and_nonzero(bits):
    ids = [derive_id("seq", i, bits=bits) for i in range(200)]
    assert all(0 < i < 2 ** bits for i in ids)
    assert max(ids) >= 2 ** (bits - 4)  # uses the full width, not a narrower hash
    assert len(set(ids)) == len(ids)
