"""Fuzzing the BPF record path without loading BPF: random, truncated and oversized records go
through :meth:`BpfReceiver._on_raw`, as the ring reader hands them on (otel_ebpf.bpf.ringread: the C reader's
bytes, or BCC's pointer and size copied into bytes).

Contract checked: ``_on_raw`` never raises into the reader; a record it cannot
decode is counted (``decode_error`` or ``unknown_record``), never silently lost; what it does
decode is a typed event. Lifecycle records (types 1-3) with random pids must not signal anyone:
``_resume`` (SIGCONT) is replaced by a recorder here, so the fuzzer never touches real processes.
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_ebpf.core.events import LibraryLoaded, ProcessExit
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.receivers import cuda, nccl
from otel_ebpf.receivers.cuda.receiver import KERNEL, MIRRORS
from otel_ebpf.receivers.nccl.receiver import LAYOUTS
from otel_ebpf.core.telemetry import DROPPED

SIZES = {"cuda": {m.etype: m.fmt.size for m in MIRRORS},
         "nccl": {layout.etype: layout.struct.size for layout in LAYOUTS}}
FACTORIES = {"cuda": cuda.factory, "nccl": nccl.factory}
# records the receiver learns from and passes on no event for: a kernel handle (receivers/cuda/kernels.py)
ABSORBED = {"cuda": {KERNEL.etype}, "nccl": set()}


def _receiver(name: str):
    ctx = Context()
    sink = ListConsumer()
    rx = FACTORIES[name].create(FACTORIES[name].config_class(), ctx, sink)
    resumed: list[int] = []
    rx._resume = lambda pid, ts=None: resumed.append(pid)  # never SIGCONT a random pid from a fuzzed record
    return rx, ctx, sink


def _feed(rx, raw: bytes) -> int:
    rx._on_raw(raw)  # raises only if the contract is broken
    return 0


def _records(name: str) -> st.SearchStrategy[bytes]:
    """Records of a known type: exact size, truncated, oversized; plus any bytes at all."""
    sizes = SIZES[name]

    @st.composite
    def typed(draw: st.DrawFn) -> bytes:
        etype = draw(st.sampled_from(sorted(sizes)))
        size = sizes[etype]
        n = draw(st.sampled_from([size, 1, size - 1, size + 1, size * 2]) | st.integers(1, size * 3))
        return bytes([etype]) + draw(st.binary(min_size=max(0, n - 1), max_size=max(0, n - 1)))

    lifecycle = st.builds(lambda t, rest: bytes([t]) + rest, st.sampled_from([1, 2, 3]),
                          st.binary(max_size=300))
    return typed() | lifecycle | st.binary(min_size=1, max_size=600)


@pytest.mark.parametrize("name", ["cuda", "nccl"])
def test_random_records_never_raise_and_every_failure_is_counted(name):
    rx, ctx, _sink = _receiver(name)
    receiver_types = set(SIZES[name])

    examples = [0]

    @given(_records(name))
    def one(raw: bytes) -> None:
        examples[0] += 1
        before = ctx.telemetry.get(DROPPED, receiver=name)
        batch_before = len(rx._batch) + len(rx._exits)
        assert _feed(rx, raw) == 0
        produced = len(rx._batch) + len(rx._exits) - batch_before
        counted = ctx.telemetry.get(DROPPED, receiver=name) - before
        if raw[0] >= 16:
            # a receiver record is exactly one of: an event, or a counted drop (or, for a record the receiver
            # only learns from, nothing: a complete one of those is absorbed)
            absorbed = raw[0] in ABSORBED[name] and len(raw) >= SIZES[name][raw[0]]
            assert produced + counted == (0 if absorbed and not counted else 1), (raw[:8], produced, counted)
            if raw[0] in receiver_types and len(raw) >= SIZES[name][raw[0]] and counted:
                # a complete record of a known type decodes unless its fields are out of range
                # (api index, op index beyond the tables): that is the one counted reason
                assert ctx.telemetry.get(DROPPED, receiver=name, reason="decode_error") > 0
        rx._batch.clear()
        rx._exits.clear()

    one()
    print(f"{name}: {examples[0]} examples")


@pytest.mark.parametrize("name", ["cuda", "nccl"])
def test_well_formed_records_decode_to_typed_events(name):
    rx, _ctx, _ = _receiver(name)

    examples = [0]

    @given(st.data())
    def one(data: st.DataObject) -> None:
        examples[0] += 1
        etype = data.draw(st.sampled_from(sorted(SIZES[name])))
        body = bytearray(data.draw(st.binary(min_size=SIZES[name][etype], max_size=SIZES[name][etype])))
        body[0] = etype
        body[1] = 0  # api/op/kind index 0 is valid in every table
        if name == "nccl":
            body[2] = 0  # flags
        assert _feed(rx, bytes(body)) == 0
        events = rx._batch[:]
        rx._batch.clear()
        if events:
            ev = events[0]
            assert type(ev).__module__.endswith(".events") and hasattr(ev, "pid")

    one()
    print(f"{name}: {examples[0]} examples")


def test_lifecycle_records_decode_without_touching_processes(tmp_path):
    rx, ctx, _ = _receiver("cuda")
    lib = tmp_path / "libcudart.so.12"
    lib.write_bytes(b"\x7fELF")
    exit_rec = struct.pack("<B3xIQ16s", 1, 4242, 123, b"tr\x01ain\xff\xfe")
    lib_rec = struct.pack("<BB2xII4xQ256s", 2, 1, 4242, 4243, 5, str(lib).encode() + b"\0\xff")
    # an open the loader only tried (a relative candidate of a pid that is gone): no library, no event
    tried_rec = struct.pack("<BB2xII4xQ256s", 2, 1, 4242, 4243, 6, b"relative/libcudart.so.12\xff")
    assert _feed(rx, exit_rec) == 0 and _feed(rx, lib_rec) == 0 and _feed(rx, tried_rec) == 0
    assert [type(e) for e in rx._exits] == [ProcessExit] and rx._exits[0].comm.startswith("tr")
    assert [(type(e), e.pid, e.path) for e in rx._batch] == [(LibraryLoaded, 4242, str(lib))]
    assert ctx.telemetry.get(DROPPED) == 0


def _bpf_receiver_types() -> list[str]:
    from otel_ebpf.service import components
    from otel_ebpf.bpf.receiver import BpfReceiver

    out = []
    for rtype, factory in sorted(components.receivers().items()):
        try:
            rx = factory.create(factory.config_class(), Context(), ListConsumer())
        except Exception:  # a receiver that needs user config to exist (probes): nothing to feed
            continue
        if isinstance(rx, BpfReceiver):
            out.append(rtype)
    return out


@pytest.mark.parametrize("rtype", _bpf_receiver_types())
def test_every_bpf_receiver_survives_random_records(rtype):
    """Every registered BPF receiver, with its default config: random records of any type and size
    never raise out of ``_on_raw``, and a receiver record yields at most one event."""
    from otel_ebpf.service import components
    factory = components.receivers()[rtype]
    ctx = Context()
    rx = factory.create(factory.config_class(), ctx, ListConsumer())
    rx._resume = lambda pid, ts=None: None  # never SIGCONT a random pid
    examples = [0]

    @given(st.integers(16, 255), st.binary(max_size=1024))
    def one(etype: int, rest: bytes) -> None:
        examples[0] += 1
        raw = bytes([etype]) + rest
        before = len(rx._batch)
        assert _feed(rx, raw) == 0
        assert len(rx._batch) - before <= 1
        rx._batch.clear()
        rx._exits.clear()

    one()
    print(f"{rtype}: {examples[0]} examples")
