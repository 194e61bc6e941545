"""otel_ebpf.bpf.compiler_memory: only never-written code mappings of the compiler are dropped."""
from __future__ import annotations

import ctypes

import psutil

from otel_ebpf.bpf.compiler_memory import _code_ranges, release_compiler_memory

MAPS = """\
7f0000000000-7f0000100000 r--p 00000000 fe:01 1 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f0000100000-7f0002000000 r-xp 00100000 fe:01 1 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f0002000000-7f0002100000 r--p 02000000 fe:01 1 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f0002100000-7f0002200000 rw-p 02100000 fe:01 1 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f0003000000-7f0003800000 r-xp 00000000 fe:01 2 /usr/lib/llvm-14/lib/libclang-cpp.so.14
7f0004000000-7f0004800000 r-xp 00000000 fe:01 3 /usr/lib/x86_64-linux-gnu/libbcc.so.0.26.0
7f0005000000-7f0005001000 r-xp 00000000 fe:01 4 /opt/notLLVM/libfoo.so
7f0006000000-7f0006001000 rw-p 00000000 00:00 0
"""


def test_only_executable_mappings_of_llvm_and_clang_are_selected() -> None:
    assert _code_ranges(MAPS, ("libLLVM", "libclang")) == [
        (0x7F0000100000, 0x7F0002000000), (0x7F0003000000, 0x7F0003800000)]


def test_release_keeps_this_process_working_and_never_raises(tmp_path) -> None:
    # the real call on this process: libc's own code is not in the list, so calling it after
    # the release proves nothing was dropped that is still needed here
    done = release_compiler_memory()
    assert done["heap_trimmed"] in (0, 1)
    assert ctypes.CDLL(None).getpid() == psutil.Process().pid
    missing = release_compiler_memory(str(tmp_path / "missing"))  # no maps file: nothing dropped
    assert missing["code_ranges"] == 0 and missing["code_bytes"] == 0
