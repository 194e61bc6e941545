"""memory.h's OOM record against its one Python mirror (sizes, offsets, type byte), and decoding."""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from otel_ebpf.pipeline import Context, ListConsumer
from otel_ebpf.receivers.memory import Config, MemoryReceiver
from otel_ebpf.receivers.memory import receiver as memory_receiver
from otel_ebpf.receivers.memory.events import OomKill
from otel_ebpf.receivers.memory.receiver import OOM
from otel_ebpf.telemetry import DROPPED

HERE = Path(memory_receiver.__file__).resolve().parent
SHIM = ("typedef unsigned char u8; typedef unsigned int u32; typedef int s32; typedef short s16;"
        " typedef unsigned long long u64;\n")


def _offsets(fmt: struct.Struct) -> list[tuple[int, int]]:
    """(offset, size) of each value a little-endian, padding-explicit format unpacks ('16s' is one)."""
    out, pos = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt.format.lstrip("<")):
        n = int(count or 1)
        if code in "xs":
            if code == "s":
                out.append((pos, n))
            pos += n
            continue
        size = struct.calcsize("<" + code)
        for _ in range(n):
            out.append((pos, size))
            pos += size
    return out


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if shutil.which("gcc") is None:
        if os.environ.get("CI"):
            pytest.fail("gcc is needed to check memory.h against its Python mirror")
        pytest.skip("gcc not found")
    s = OOM.c_struct
    lines = [f'printf("sizeof %zu\\n", sizeof(struct {s}));', 'printf("etype %d\\n", MM_EV_OOM_KILL);']
    for f in OOM.fields:
        lines.append(f'printf("off {f} %zu %zu\\n", __builtin_offsetof(struct {s}, {f}), '
                     f'sizeof(((struct {s} *)0)->{f}));')
    src = f'#include <stdio.h>\n{SHIM}#include "memory.h"\nint main(void)\n{{\n' + "\n".join(lines) + "\nreturn 0;\n}\n"
    tmp = tmp_path_factory.mktemp("memory_layout")
    (tmp / "l.c").write_text(src)
    subprocess.run(["gcc", "-Wall", "-Werror", f"-I{HERE}", "-o", str(tmp / "l"), str(tmp / "l.c")],
                   check=True, capture_output=True, timeout=60)
    out = subprocess.run([str(tmp / "l")], check=True, capture_output=True, text=True, timeout=10).stdout
    values: dict[str, int] = {}
    for line in out.splitlines():
        w = line.split()
        if w[0] == "off":
            values[f"off {w[1]}"], values[f"size {w[1]}"] = int(w[2]), int(w[3])
        else:
            values[w[0]] = int(w[1])
    return values


def test_oom_mirror_matches_c_layout(c_layout: dict[str, int]) -> None:
    assert OOM.fmt.size == c_layout["sizeof"]
    offsets = _offsets(OOM.fmt)
    assert len(offsets) == len(OOM.fields)
    for (offset, size), field in zip(offsets, OOM.fields, strict=True):
        assert (offset, size) == (c_layout[f"off {field}"], c_layout[f"size {field}"]), field


def test_oom_record_type_is_in_the_memory_range(c_layout: dict[str, int]) -> None:
    assert OOM.etype == c_layout["etype"] and 80 <= OOM.etype <= 95
    assert OOM.fields[0] == "type" and _offsets(OOM.fmt)[0] == (0, 1)


def test_decode_oom_record_into_bytes_and_epoch_time() -> None:
    r = MemoryReceiver(Config(), Context(), ListConsumer())  # decode needs no BPF
    raw = OOM.fmt.pack(80, 4242, 1000, 300, 65536, 128, 4, 0, -1000, 4243, b"hog\0")
    assert r.decode(80, raw) == OomKill(4242, "hog", 1000 + r.clock.offset_ns, 300 * 1024, 65536 * 1024,
                                        128 * 1024, 4 * 1024, 0, -1000, 4243)


def test_malformed_memory_records_are_counted_not_raised() -> None:
    r = MemoryReceiver(Config(), Context(), ListConsumer())
    for raw in (bytes([80]) + bytes(10), bytes([81]) + bytes(OOM.fmt.size - 1)):
        buf = ctypes.create_string_buffer(raw, len(raw))
        assert r._on_record(None, ctypes.addressof(buf), len(raw)) == 0
    assert r.ctx.telemetry.get(DROPPED, receiver="memory", reason="decode_error") == 2
