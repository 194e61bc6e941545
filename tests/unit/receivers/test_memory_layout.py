"""memory.h's OOM record against its one Python mirror (sizes, offsets, type byte), and decoding."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.receivers.memory import Config, MemoryReceiver
from otel_ebpf.receivers.memory import receiver as memory_receiver
from otel_ebpf.receivers.memory.events import OomKill
from otel_ebpf.receivers.memory.receiver import OOM
from otel_ebpf.core.telemetry import DROPPED

from tests.support.layout import CLayout, assert_mirror, format_offsets, measure

HERE = Path(memory_receiver.__file__).resolve().parent


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> CLayout:
    return measure(HERE, "memory.h", tmp_path_factory.mktemp("memory_layout"), structs={OOM.c_struct: OOM.fields},
                   values=["MM_EV_OOM_KILL"])


def test_oom_mirror_matches_c_layout(c_layout: CLayout) -> None:
    assert_mirror(c_layout, OOM.c_struct, OOM.fmt, OOM.fields)


def test_oom_record_type_is_in_the_memory_range(c_layout: CLayout) -> None:
    assert OOM.etype == c_layout.values["MM_EV_OOM_KILL"] and 80 <= OOM.etype <= 95
    assert OOM.fields[0] == "type" and format_offsets(OOM.fmt)[0] == (0, 1)


def test_decode_oom_record_into_bytes_and_epoch_time() -> None:
    r = MemoryReceiver(Config(), Context(), ListConsumer())  # decode needs no BPF
    raw = OOM.fmt.pack(80, 4242, 1000, 300, 65536, 128, 4, 0, -1000, 4243, b"hog\0")
    assert r.decode(80, raw) == OomKill(4242, "hog", 1000 + r.clock.offset_ns, 300 * 1024, 65536 * 1024,
                                        128 * 1024, 4 * 1024, 0, -1000, 4243)


def test_malformed_memory_records_are_counted_not_raised() -> None:
    r = MemoryReceiver(Config(), Context(), ListConsumer())
    for raw in (bytes([80]) + bytes(10), bytes([81]) + bytes(OOM.fmt.size - 1)):
        r._on_raw(raw)  # never raises: counted
    assert r.ctx.telemetry.get(DROPPED, receiver="memory", reason="decode_error") == 2
