"""Giving back the memory BPF compilation used, once the programs are loaded.

BCC compiles in process with clang/LLVM. After start-up the agent no longer needs either, but
measured on the project VM (2 receivers, BCC 0.26, LLVM 14) they kept ~110 MiB of its RSS:

* ~35 MiB of freed heap that glibc keeps in its arenas: ``malloc_trim(0)`` returns it.
* ~80 MiB of libLLVM / libclang-cpp code pages. Their executable mappings (``r-xp``) are never
  written (x86-64 shared libraries have no text relocations), so ``madvise(MADV_DONTNEED)``
  drops them from this process safely: they fault back in from the page cache if a program is
  compiled again later (a library opened after start needs no compile; a USDT attach to a new
  process may). Writable or relocated mappings (``.data``, RELRO) are never touched: dropping
  them would lose what the dynamic linker wrote.

Nothing here is needed for correctness; every step is best effort and reports what it did.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["COMPILER_LIBRARIES", "release_compiler_memory"]

log = logging.getLogger(__name__)
COMPILER_LIBRARIES = ("libLLVM", "libclang")  # basename prefixes; libbcc itself stays (polling uses it)
_MADV_DONTNEED = 4


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc


def _code_ranges(maps_text: str, prefixes: tuple[str, ...]) -> list[tuple[int, int]]:
    """Executable, never-written mappings (``r-xp``) of libraries whose basename starts with
    one of ``prefixes``, from /proc/self/maps text."""
    out = []
    for line in maps_text.splitlines():
        parts = line.split()
        if len(parts) < 6 or parts[1] != "r-xp":
            continue
        base = parts[5].rsplit("/", 1)[-1]
        if base.startswith(prefixes):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi))
    return out


def release_compiler_memory(maps_path: str = "/proc/self/maps") -> dict[str, int]:
    """Trim the heap and drop the compiler's code pages; returns what was done
    (``heap_trimmed``: 1/0, ``code_ranges``, ``code_bytes``). Never raises."""
    done = {"heap_trimmed": 0, "code_ranges": 0, "code_bytes": 0}
    libc = _libc()
    if libc is None:
        return done
    try:
        done["heap_trimmed"] = int(bool(libc.malloc_trim(0)))
    except AttributeError:  # not glibc (musl has no malloc_trim)
        pass
    try:
        with open(maps_path) as f:
            ranges = _code_ranges(f.read(), COMPILER_LIBRARIES)
    except OSError:
        return done
    for lo, hi in ranges:
        if libc.madvise(lo, hi - lo, _MADV_DONTNEED) == 0:
            done["code_ranges"] += 1
            done["code_bytes"] += hi - lo
    log.debug("released compiler memory: %s", done)
    return done
