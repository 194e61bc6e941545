"""otel_ebpf.bpf.ringread: the C reader hands on exactly the records BCC's callbacks would, in their order.

A program writes numbered records of two sizes into two ring buffers on this process's getppid() calls; the
records are read with the C reader (both rings in one manager, as BpfReceiver reads events and lifecycle) and,
from the same kind of program, with BCC's callbacks, and compared byte for byte. Bounds: a reader that takes at
most a few records a call takes the rest on the next calls, losing none.
"""
from __future__ import annotations

import os
import struct
from typing import Any

import pytest

from otel_ebpf.bpf import ringread
from otel_ebpf.core.telemetry import Telemetry

pytestmark = pytest.mark.bpf

PROGRAM = r"""
BPF_RINGBUF_OUTPUT(small, 8);
BPF_RINGBUF_OUTPUT(large, 8);
BPF_ARRAY(seq, u32, 1);
struct small_rec { u8 type; u8 pad[3]; u32 seq; u64 tag; };
struct large_rec { u8 type; u8 pad[3]; u32 seq; u64 tag; u64 more[3]; };
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    if (bpf_get_current_pid_tgid() >> 32 != TARGET) return 0;
    int zero = 0;
    u32 *n = seq.lookup(&zero);
    if (!n) return 0;
    u32 s = *n;  /* one thread calls getppid: no atomic needed (LLVM 14 refuses XADD's return value) */
    *n = s + 1;
    if (s % 3 == 2) {
        struct large_rec *r = large.ringbuf_reserve(sizeof(*r));
        if (!r) return 0;
        __builtin_memset(r, 0, sizeof(*r));
        r->type = 2; r->seq = s; r->tag = 0x1122334455667788ULL ^ s; r->more[2] = s * 7;
        large.ringbuf_submit(r, 0);
    } else {
        struct small_rec *r = small.ringbuf_reserve(sizeof(*r));
        if (!r) return 0;
        __builtin_memset(r, 0, sizeof(*r));
        r->type = 1; r->seq = s; r->tag = 0x1122334455667788ULL ^ s;
        small.ringbuf_submit(r, 0);
    }
    return 0;
}
"""
SMALL, LARGE = struct.Struct("<B3xIQ"), struct.Struct("<B3xIQ3Q")


def expected(n: int) -> list[bytes]:
    """The records of n calls as each ring holds them (small ones, then large ones: libbpf reads ring by ring)."""
    small = [SMALL.pack(1, s, 0x1122334455667788 ^ s) for s in range(n) if s % 3 != 2]
    large = [LARGE.pack(2, s, 0x1122334455667788 ^ s, 0, 0, s * 7) for s in range(n) if s % 3 == 2]
    return small + large


def read(bcc: Any, native: bool, calls: int, max_records: int = ringread.MAX_RECORDS) -> tuple[list[bytes], int]:
    """The records ``calls`` getppid() calls wrote, read through a Rings (C or BCC), and how many reads it took."""
    b = bcc.BPF(text=PROGRAM, cflags=[f"-DTARGET={os.getpid()}"])
    got: list[bytes] = []
    saved = ringread.use_native, ringread.MAX_RECORDS
    ringread.use_native, ringread.MAX_RECORDS = native, max_records
    try:
        rings = ringread.Rings(b, ("small", "large"), got.append, Telemetry(), "test")
        assert rings.native is native
        for _ in range(calls):
            os.getppid()
        reads = 0
        rings.poll(100)
        while len(got) < calls and reads < 10 * calls:
            reads += 1
            rings.consume()
        rings.close()
        rings.close()
    finally:
        ringread.use_native, ringread.MAX_RECORDS = saved
        b.cleanup()
    return got, reads


def test_the_c_reader_is_built():
    assert ringread.NATIVE, "otel_ebpf.bpf._ringread did not build (pip install -e . builds it; needs gcc)"


def test_the_c_reader_hands_on_every_record_of_both_rings_as_bccs_callbacks_do(bpf_ready: None) -> None:
    from otel_ebpf.bpf.loader import import_bcc

    bcc = import_bcc()
    native, _ = read(bcc, True, 300)
    through_bcc, _ = read(bcc, False, 300)
    assert native == through_bcc == expected(300)


def test_a_reader_bounded_to_a_few_records_a_call_takes_the_rest_on_later_calls(bpf_ready: None) -> None:
    from otel_ebpf.bpf.loader import import_bcc

    got, reads = read(import_bcc(), True, 100, max_records=7)
    assert sorted(got) == sorted(expected(100))  # none lost, none twice
    assert reads >= 100 // 7 - 1  # it did stop at the bound


def test_a_closed_reader_refuses_to_poll() -> None:
    from otel_ebpf.bpf import _ringread  # type: ignore[attr-defined]

    reader = _ringread.Reader(1, 1, 1, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="closed or has no ring buffer"):
        reader.poll(0)
    with pytest.raises(ValueError, match="must be >= 1"):
        _ringread.Reader(1, 1, 1, 1, 1, 0, 1)
