"""The CUDA receiver's call records decoded in C (otel_ebpf.bpf._recdec) == its Python decode, record for record.

The Python ``CudaReceiver.decode`` is the reference: for every call record type, random records (every field over
its whole range, unknown api ids and context kinds, short records) must give the same event, field for field and
of the same types (``captured`` a bool, not 1), or be handed back to the Python decode exactly when it raises. The
receiver's batch path (``_on_records``) must hand the pipeline what its per-record path does, in the same order,
with the same drops counted and the same processes read.
"""
from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ebpf.bpf import records
from otel_ebpf.bpf.records import Mirror, RecordDecoders, decoder, epoch, uint
from otel_ebpf.core.events import SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.core.telemetry import DROPPED
from otel_ebpf.receivers.cuda import Config
from otel_ebpf.receivers.cuda.events import MemcpyCall
from otel_ebpf.receivers.cuda.receiver import (
    ALLOC,
    FREE,
    GRAPH,
    KERNEL,
    LAUNCH,
    MEMCPY,
    SET_DEVICE,
    SYNC,
    CudaReceiver,
)

pytestmark = pytest.mark.skipif(not records.NATIVE, reason="unreachable: the C decoder is built by scripts/setup.sh")
CALLS = (MEMCPY, ALLOC, FREE, SYNC, SET_DEVICE, GRAPH)
_RANGES = {"B": (0, 255), "b": (-128, 127), "I": (0, 2**32 - 1), "i": (-2**31, 2**31 - 1),
           "Q": (0, 2**64 - 1), "q": (-2**63, 2**63 - 1)}


def _codes(mirror: Mirror) -> list[str]:
    return [mirror.offset(name)[2] for name in mirror.fields]


def _record(mirror: Mirror) -> st.SearchStrategy[bytes]:
    """Records of ``mirror``'s type: small values (real ids, kinds, pids) as often as any in range."""
    def value(name: str, code: str) -> st.SearchStrategy[int]:
        if name.endswith("type"):
            return st.just(mirror.etype)
        lo, hi = _RANGES[code]
        return st.one_of(st.integers(max(lo, 0), min(hi, 4)), st.integers(lo, hi))
    return st.tuples(*(value(n, c) for n, c in zip(mirror.fields, _codes(mirror), strict=True))).map(
        lambda values: mirror.fmt.pack(*values))


def _receiver() -> CudaReceiver:
    return CudaReceiver(Config(), Context(), ListConsumer())


def _same_event(a: object, b: object) -> None:
    assert type(a) is type(b)
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        va, vb = getattr(a, f.name), getattr(b, f.name)
        assert type(va) is type(vb) and va == vb, f.name


def _python(r: CudaReceiver, raw: bytes) -> object | BaseException:
    try:
        return r.decode(raw[0], raw)
    except Exception as exc:
        return exc


@settings(max_examples=300, deadline=None)
@given(st.one_of(*(_record(m) for m in CALLS)), st.integers(-2**62, 2**62))
def test_c_decode_equals_the_python_decode(raw: bytes, offset_ns: int) -> None:
    r = _receiver()
    r.clock.offset_ns = offset_ns
    (item,), back, _ = CudaReceiver.record_decoders.decode([raw], offset_ns, set())
    want = _python(r, raw)
    if isinstance(want, BaseException):
        assert item is raw and back == 1  # handed back: the Python decode counts it
    else:
        assert back == 0
        _same_event(item, want)


def test_the_c_decoders_cover_every_completed_call_and_leave_launches_and_names_to_python() -> None:
    r = _receiver()
    zero = {m.etype: m.fmt.pack(m.etype, *([0] * (len(m.fields) - 1))) for m in (*CALLS, LAUNCH)}
    zero[KERNEL.etype] = KERNEL.fmt.pack(KERNEL.etype, 0, 1, 2, 3, b"kernel")
    items, back, _ = CudaReceiver.record_decoders.decode(list(zero.values()), r.clock.offset_ns, set())
    assert back == 2 and items[-2:] == [zero[LAUNCH.etype], zero[KERNEL.etype]]
    for raw, item in zip(list(zero.values())[:-2], items[:-2], strict=True):
        _same_event(item, r.decode(raw[0], raw))


@pytest.mark.parametrize("raw", [MEMCPY.fmt.pack(16, 4, 0, 0, 1, 10, 11, 1, 2, 0, 0, 0, 1, 2, 3, 4, 1)[:-1],
                                 b"", b"\x10", MEMCPY.fmt.pack(16, 250, *([0] * 15)),
                                 MEMCPY.fmt.pack(16, 4, 7, 0, *([0] * 13))],
                         ids=["one_byte_short", "empty", "type_only", "unknown_api", "unknown_context_kind"])
def test_records_the_c_decoder_cannot_make_are_handed_back_as_they_were(raw: bytes) -> None:
    (item,), back, pids = CudaReceiver.record_decoders.decode([raw], 0, set())
    assert item is raw and back == 1 and pids == []


def test_new_pids_are_the_events_pids_not_seen_each_once() -> None:
    raws = [MEMCPY.fmt.pack(16, 4, 0, 0, 0, pid, 1, 1, 2, 0, 0, 0, 1, 2, 3, 4, 1) for pid in (7, 8, 7, 9, 8)]
    _, _, pids = CudaReceiver.record_decoders.decode(raws, 0, {8: None})
    assert pids == [7, 9]


def _traffic(r: CudaReceiver) -> list[bytes]:
    """A poll's records as the ring gives them: calls of two processes, a bad one, a kernel name, a launch."""
    off = 0
    out = [MEMCPY.fmt.pack(16, 4, 0, i % 2, 0, 100 + i % 2, 5, 10 + i, 20 + i, 0, 0, 0, 1, 2, 64 * i, 3, 1)
           for i in range(6)]
    out.insert(3, MEMCPY.fmt.pack(16, 250, *([0] * 15)))  # unknown api: decode_error
    out.append(KERNEL.fmt.pack(23, 0, 100, 0x10, 0x20, b"k"))
    out.append(LAUNCH.fmt.pack(21, 0, 0, 0, 0, 100, 5, 7, 0x10, 1, 1, 1, 32, 1, 1, 0, 0, 1, off, off))
    out.append(SYNC.fmt.pack(19, 1, 0, 0, 0, 101, 6, 30, 40, 0, 0, 0, 0))
    return out


def _through(path: str, raws: list[bytes]) -> tuple[list[object], int, list[int], int]:
    """(events handed on, decode errors counted, pids read, records decoded in Python)."""
    r = _receiver()
    r.clock.offset_ns = 1000
    seen: list[int] = []
    r._snapshot = lambda pid, **kw: (seen.append(pid), r._seen_pids.__setitem__(pid, None))  # type: ignore[method-assign]
    in_python = 0
    on_raw = r._on_raw

    def counted(raw: bytes) -> None:
        nonlocal in_python
        in_python += 1
        on_raw(raw)
    r._on_raw = counted  # type: ignore[method-assign]
    if path == "records":
        r._on_records(raws)
    else:
        for raw in raws:
            r._on_raw(raw)
    r._flush(with_maps=False)
    return r.next.take(), r.ctx.telemetry.get(DROPPED, receiver="cuda", reason="decode_error"), seen, in_python


@pytest.mark.parametrize("clean", [True, False], ids=["decoded_whole", "with_records_handed_back"])
def test_the_batch_path_hands_on_what_the_record_path_does(clean: bool) -> None:
    raws = _traffic(_receiver())
    if clean:
        raws = [raw for raw in raws if raw[0] in (MEMCPY.etype, SYNC.etype) and raw[1] != 250]
    got, want = _through("records", raws), _through("raw", raws)
    assert len(got[0]) == len(want[0]) and got[1:3] == want[1:3]
    assert got[3] == (0 if clean else 3)  # in Python: only the bad record, the kernel name and the launch
    for a, b in zip(got[0], want[0], strict=True):
        _same_event(a, b)


def test_a_poll_over_a_chunk_is_handed_on_a_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_ebpf.bpf import receiver as base

    monkeypatch.setattr(base, "_CHUNK", 4)
    r = _receiver()
    sizes: list[int] = []
    r.next.consume = lambda batch: sizes.append(len(batch))  # type: ignore[method-assign]
    r._on_records([MEMCPY.fmt.pack(16, 4, 0, 0, 0, 1, 1, 1, 2, 0, 0, 0, 1, 2, 3, 4, 1)] * 10)
    assert sizes == [4, 4]  # the last 2 wait for the turn's flush


def test_decoder_refuses_a_class_it_cannot_fill_and_fields_left_out() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Plain:  # the dataclass's own __init__: not known to store only
        pid: int

    mirror = Mirror("r", 16, struct.Struct("<B3xI"), ("type", "pid"))
    with pytest.raises(TypeError, match="fast_init"):
        decoder(mirror, Plain, pid=uint("pid"))
    with pytest.raises(TypeError, match="missing or unknown"):
        decoder(MEMCPY, MemcpyCall, pid=uint("call.pid"))
    with pytest.raises(TypeError, match="not a u64 time"):
        decoder(mirror, SpanRecord, **{f.name: epoch("pid") for f in dataclasses.fields(SpanRecord)})
    assert RecordDecoders({}).decode([b"\x10"], 0, set()) == ([b"\x10"], 1, [])
