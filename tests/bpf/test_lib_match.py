"""common.bpf.c's library-open match (oe_lib_match): a traced process's successful openat is reported when the
basename of the path starts with OE_LIB_PATTERN, whatever the directories (their names, depth, length).

The basename scan is a bounded loop with its offset on the stack (not unrolled: ~0.45 s of compile per program,
issue 18); this drives the real program with real opens."""
from __future__ import annotations

import ctypes as ct
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.bpf.loader import COMMON_SRC

pytestmark = pytest.mark.bpf
_LIBOPEN = struct.Struct("<BB2xII4xQ256s")  # struct oe_lib_open (otel_ebpf/bpf/receiver.py)
_EV_LIB_OPEN = 2


def _opened_by_child(bcc: Any, paths: list[str], cwd: Path) -> list[str]:
    """Paths a traced child's opens of ``paths`` (in ``cwd``) were reported with."""
    b = bcc.BPF(text=COMMON_SRC.read_text(), cflags=["-DOE_FILTER_PIDS=1", '-DOE_LIB_PATTERN="liboezz"',
                                                     "-DOE_PAUSE_ON_LOAD=0", f"-DOE_AGENT_TGID={os.getpid()}",
                                                     "-Wno-unused-function"])
    seen: list[str] = []

    def on_record(_ctx: Any, data: Any, size: int) -> int:
        raw = ct.string_at(data, size)
        if raw[0] == _EV_LIB_OPEN:
            seen.append(_LIBOPEN.unpack_from(raw)[5].split(b"\0", 1)[0].decode())
        return 0

    try:
        b["lifecycle"].open_ring_buffer(on_record)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.read(r, 1)
                os.chdir(cwd)
                for p in paths:
                    os.close(os.open(p, os.O_RDONLY))
            finally:
                os._exit(0)
        b["traced"][ct.c_uint32(pid)] = ct.c_uint8(1)
        os.write(w, b"x")
        os.waitpid(pid, 0)
        b.ring_buffer_poll(200)
        b.ring_buffer_consume()
    finally:
        b.cleanup()
    return seen


def test_basename_starting_with_the_pattern_is_reported_wherever_it_lies(bpf_ready: None, tmp_path: Path) -> None:
    from otel_ebpf.bpf.loader import import_bcc

    deep = tmp_path
    while len(str(deep)) < 200:
        deep = deep / "d123456789"
    files = {"a/liboezz.so.1": True, "liboezz/other.so": False, "x/libliboezz.so": False, "e/xliboezz": False,
             "e/liboezz": True, "e/liboez": False, "liboezz.top": True}
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    deep.mkdir(parents=True)
    (deep / "liboezz.deep").write_text("")
    long_path = str(deep / "liboezz.deep")
    assert 200 < len(long_path) < 255  # within the 256-byte buffer the program reads
    paths = [str(tmp_path / rel) for rel in files] + ["liboezz.top", "a/liboezz.so.1", long_path]
    seen = _opened_by_child(import_bcc(), paths, tmp_path)
    expected = [str(tmp_path / rel) for rel, hit in files.items() if hit] + ["liboezz.top", "a/liboezz.so.1",
                                                                            long_path]
    assert seen == expected
