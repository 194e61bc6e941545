"""The few bpf(2) map commands that must work without BCC: the pause guard's supervisor
(otel_ebpf.bpf.pauseguard) is a separate small process that reads and writes pinned maps and must
not pay BCC's import (~100 ms, ~40 MiB) nor share its fate. Standard library only.

Commands and ``union bpf_attr`` layouts follow include/uapi/linux/bpf.h (Linux 6.x; every
field used here exists since 4.4-4.15). Attributes are passed as a zeroed 128-byte buffer:
the kernel zero-fills a shorter attr and rejects non-zero bytes past its own size.

Every function raises OSError (errno and the command named) except :func:`lookup`, which
returns None for a missing key. Thread-safe (no shared state besides the libc handle).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import struct

__all__ = ["ARRAY", "HASH", "close", "delete", "keys", "lookup", "map_create", "obj_get", "obj_pin", "update"]

HASH, ARRAY = 1, 2  # enum bpf_map_type
_MAP_CREATE, _LOOKUP, _UPDATE, _DELETE, _NEXT_KEY, _OBJ_PIN, _OBJ_GET = 0, 1, 2, 3, 4, 6, 7
_ATTR_SIZE = 128
# __NR_bpf per architecture (arch/*/entry/syscalls, include/uapi/asm-generic/unistd.h)
_NR_BPF = {"x86_64": 321, "aarch64": 280, "arm64": 280, "ppc64le": 361, "s390x": 351, "riscv64": 280}
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char], what: str) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(0, f"bpf(2) syscall number unknown on {platform.machine()}")
    ret = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), attr, ctypes.c_uint(_ATTR_SIZE))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf({what}): {os.strerror(err)}")
    return int(ret)


def _attr(fmt: str, *values: int) -> ctypes.Array[ctypes.c_char]:
    buf = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into(fmt, buf, 0, *values)
    return buf


def map_create(map_type: int, key_size: int, value_size: int, max_entries: int) -> int:
    """A new map; returns its fd (close it with :func:`close`)."""
    return _bpf(_MAP_CREATE, _attr("<IIIII", map_type, key_size, value_size, max_entries, 0), "BPF_MAP_CREATE")


def obj_pin(fd: int, path: str) -> None:
    """Pin the map ``fd`` at ``path`` on bpffs (the folder must exist)."""
    name = ctypes.create_string_buffer(os.fsencode(path))
    _bpf(_OBJ_PIN, _attr("<QII", ctypes.addressof(name), fd, 0), f"BPF_OBJ_PIN {path}")


def obj_get(path: str) -> int:
    """An fd of the object pinned at ``path``."""
    name = ctypes.create_string_buffer(os.fsencode(path))
    return _bpf(_OBJ_GET, _attr("<QII", ctypes.addressof(name), 0, 0), f"BPF_OBJ_GET {path}")


def _elem(fd: int, key: ctypes.Array[ctypes.c_char], val: ctypes.Array[ctypes.c_char] | None,
          flags: int = 0) -> ctypes.Array[ctypes.c_char]:
    # struct { __u32 map_fd; __aligned_u64 key; __aligned_u64 value / next_key; __u64 flags; }
    return _attr("<I4xQQQ", fd, ctypes.addressof(key), ctypes.addressof(val) if val is not None else 0, flags)


def lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    """The value of ``key``; None when the map has no such key."""
    k, v = ctypes.create_string_buffer(key, len(key)), ctypes.create_string_buffer(value_size)
    try:
        _bpf(_LOOKUP, _elem(fd, k, v), "BPF_MAP_LOOKUP_ELEM")
    except OSError as exc:
        if exc.errno == 2:  # ENOENT
            return None
        raise
    return v.raw


def update(fd: int, key: bytes, value: bytes) -> None:
    """Create or replace ``key`` (BPF_ANY)."""
    k, v = ctypes.create_string_buffer(key, len(key)), ctypes.create_string_buffer(value, len(value))
    _bpf(_UPDATE, _elem(fd, k, v), "BPF_MAP_UPDATE_ELEM")


def delete(fd: int, key: bytes) -> bool:
    """Remove ``key``; False when it was not there."""
    k = ctypes.create_string_buffer(key, len(key))
    try:
        _bpf(_DELETE, _elem(fd, k, None), "BPF_MAP_DELETE_ELEM")
    except OSError as exc:
        if exc.errno == 2:
            return False
        raise
    return True


def keys(fd: int, key_size: int, limit: int = 1 << 20) -> list[bytes]:
    """Every key of a hash map (at most ``limit``: the bound only guards against a loop)."""
    out: list[bytes] = []
    cur = ctypes.create_string_buffer(key_size)
    nxt = ctypes.create_string_buffer(key_size)
    first = True
    while len(out) < limit:
        # a NULL key asks for the first one (kernel 4.12+)
        attr = _attr("<I4xQQQ", fd, 0 if first else ctypes.addressof(cur), ctypes.addressof(nxt), 0)
        try:
            _bpf(_NEXT_KEY, attr, "BPF_MAP_GET_NEXT_KEY")
        except OSError as exc:
            if exc.errno == 2:
                break
            raise
        out.append(nxt.raw)
        ctypes.memmove(cur, nxt, key_size)
        first = False
    return out


def close(fd: int | None) -> None:
    """Close ``fd`` if it is one; never raises."""
    if fd is not None and fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass
