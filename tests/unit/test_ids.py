"""otel_ebpf.emit.ids: derived ids agree everywhere; forced ids are per thread and used once."""
from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from otel_ebpf.emit.ids import ForcibleIdGenerator, derive_id, forced_ids


def test_derive_id_is_stable_across_calls():
    assert derive_id("comm", 7) == derive_id("comm", 7)
    assert derive_id("comm", 7) != derive_id("comm", 8)
    assert derive_id("a", "bc") != derive_id("ab", "c")  # parts are separated


def test_derive_id_is_stable_across_processes():
    code = "from otel_ebpf.emit.ids import derive_id; print(derive_id('0xabc', 42), derive_id('x', bits=64))"
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert runs == {f"{derive_id('0xabc', 42)} {derive_id('x', bits=64)}\n"}


@pytest.mark.parametrize("bits", [64, 128])
def test_derive_id_width_and_nonzero(bits):
    ids = [derive_id("seq", i, bits=bits) for i in range(200)]
    assert all(0 < i < 2 ** bits for i in ids)
    assert max(ids) >= 2 ** (bits - 4)  # uses the full width, not a narrower hash
    assert len(set(ids)) == len(ids)


def test_random_ids_without_forcing():
    gen = ForcibleIdGenerator()
    traces = {gen.generate_trace_id() for _ in range(50)}
    spans = {gen.generate_span_id() for _ in range(50)}
    assert len(traces) == 50 and len(spans) == 50 and 0 not in traces | spans


def test_forced_ids_are_used_once_then_random():
    gen = ForcibleIdGenerator()
    with forced_ids(0xAB, 0xCD):
        assert gen.generate_trace_id() == 0xAB
        assert gen.generate_span_id() == 0xCD
        assert gen.generate_span_id() != 0xCD
    with forced_ids(None, 0xEE):
        assert gen.generate_trace_id() != 0xAB
        assert gen.generate_span_id() == 0xEE


def test_forced_ids_end_with_the_block():
    gen = ForcibleIdGenerator()
    with forced_ids(0xAB, 0xCD):
        pass
    assert gen.generate_trace_id() != 0xAB and gen.generate_span_id() != 0xCD
    with pytest.raises(RuntimeError), forced_ids(0x11, 0x22):
        raise RuntimeError
    assert gen.generate_trace_id() != 0x11 and gen.generate_span_id() != 0x22


def test_forced_ids_are_thread_local():
    gen = ForcibleIdGenerator()
    inside, other = threading.Event(), threading.Event()
    seen: list[int] = []

    def elsewhere() -> None:
        inside.wait(5)
        seen.extend([gen.generate_trace_id(), gen.generate_span_id()])
        other.set()

    t = threading.Thread(target=elsewhere)
    t.start()
    with forced_ids(0x1234, 0x5678):
        inside.set()
        assert other.wait(5)
        assert (gen.generate_trace_id(), gen.generate_span_id()) == (0x1234, 0x5678)
    t.join()
    assert 0x1234 not in seen and 0x5678 not in seen
