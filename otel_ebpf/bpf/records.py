"""The Python mirror of a C record struct that a BPF program writes to its ring buffer.

House rule (docs/architecture.md, "BPF programs"): every record struct starts with a type byte,
is zeroed before it is filled, and has exactly one :class:`Mirror`. A receiver's
``tests/unit/test_<name>_layout.py`` measures the struct with gcc and checks the mirror's size
and the offset and size of every unpacked value against it (``tests/support/layout.py``
``assert_mirror``), so a C change that the Python side misses fails a unit test, not a run.

Immutable, so safe to share between threads.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["Mirror"]


@dataclass(frozen=True)
class Mirror:
    """One C record struct: ``c_struct`` its name in the receiver's header (``struct
    cuda_memcpy_rec``), ``etype`` its type byte (the header's ``*_EV_*`` value), ``fmt`` its
    layout as a little-endian ``struct`` format with every padding byte explicit (``x``), and
    ``fields`` the C member designators of the values ``fmt`` unpacks, in order (``call.pid``,
    ``grid[1]``; padding unpacks no value and has no name here)."""

    c_struct: str
    etype: int
    fmt: struct.Struct
    fields: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.fmt.format.startswith("<"):
            raise ValueError(f"{self.c_struct}: a mirror is little-endian with explicit padding ('<'), "
                             f"not {self.fmt.format!r}")
        if not self.fields or self.fields[0] not in ("type", "call.type"):
            raise ValueError(f"{self.c_struct}: a record starts with its type byte, not {self.fields[:1]}")

    @property
    def size(self) -> int:
        """``sizeof(struct <c_struct>)``: the bytes a record of this type fills."""
        return self.fmt.size
