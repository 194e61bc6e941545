"""The Python mirror of a C record struct that a BPF program writes to its ring buffer, and its decoder in C.

House rule (docs/architecture.md, "BPF programs"): every record struct starts with a type byte,
is zeroed before it is filled, and has exactly one :class:`Mirror`. A receiver's
``tests/unit/test_<name>_layout.py`` measures the struct with gcc and checks the mirror's size
and the offset and size of every unpacked value against it (``tests/support/layout.py``
``assert_mirror``), so a C change that the Python side misses fails a unit test, not a run.

A receiver's hot record types may also be decoded in C (``otel_ebpf.bpf._recdec``, issue 19): :func:`decoder`
describes how each field of the event class comes from the mirror's members (:func:`uint`, :func:`epoch`,
:func:`index`, :func:`flag`, :func:`const`, :func:`call`), and :class:`RecordDecoders` decodes a batch of records,
handing back the ones it has no decoder for (or cannot decode) to the receiver's Python ``decode``. The
receiver's Python ``decode`` stays the reference: its tests compare both on the same records.

Immutable, so safe to share between threads.
"""
from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from otel_ebpf.core.frozen import has_fast_init

try:
    from otel_ebpf.bpf import _recdec  # type: ignore[attr-defined]
except ImportError:  # the optional extension is not built: every record is decoded in Python
    _recdec = None

__all__ = ["NATIVE", "FieldSpec", "Mirror", "RecordDecoders", "call", "const", "decoder", "epoch", "flag",
           "format_offsets", "index", "uint"]

NATIVE = _recdec is not None
use_native = True  # False: receivers started from now on decode every record in Python (bench/run.py --python-decode)


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

    def offset(self, member: str) -> tuple[int, int, str]:
        """(offset, size, struct code) of the value named ``member`` (one of :attr:`fields`); KeyError if none."""
        try:
            i = self.fields.index(member)
        except ValueError:
            raise KeyError(f"{self.c_struct} has no member {member!r}") from None
        return _codes(self.fmt)[i]


def _codes(fmt: struct.Struct) -> list[tuple[int, int, str]]:
    out, pos = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt.format[1:]):
        n = int(count or 1)
        if code in "xs":
            if code == "s":
                out.append((pos, n, code))
            pos += n
            continue
        size = struct.calcsize("<" + code)
        for _ in range(n):
            out.append((pos, size, code))
            pos += size
    return out


def format_offsets(fmt: struct.Struct) -> list[tuple[int, int]]:
    """(offset, size) of each value a little-endian, padding-explicit format unpacks: ``x`` is
    padding, ``16s`` one value of 16 bytes, ``3I`` three values."""
    if not fmt.format.startswith("<"):
        raise ValueError(f"{fmt.format}: mirrors are little-endian with explicit padding")
    return [(off, size) for off, size, _ in _codes(fmt)]


@dataclass(frozen=True)
class FieldSpec:
    """Where one field of an event comes from (:func:`uint` and the others make these)."""

    op: str
    members: tuple[str, ...] = ()
    arg: Any = None


def uint(member: str) -> FieldSpec:
    """The integer ``member`` as it is (signed or not as the mirror's format code says)."""
    return FieldSpec("int", (member,))


def flag(member: str) -> FieldSpec:
    """``bool(member)``."""
    return FieldSpec("bool", (member,))


def epoch(member: str) -> FieldSpec:
    """The kernel monotonic ns ``member`` plus the clock's ``offset_ns`` (otel_ebpf.bpf.clock)."""
    return FieldSpec("epoch", (member,))


def index(member: str, values: Sequence[Any]) -> FieldSpec:
    """``values[member]``; a record whose value is past the end is handed back to the Python decode."""
    return FieldSpec("index", (member,), tuple(values))


def const(value: Any) -> FieldSpec:
    """``value`` for every record (a field the record does not carry)."""
    return FieldSpec("const", (), value)


def call(fn: Callable[[int, int, int], Any], member: str, a: str, b: str) -> FieldSpec:
    """None when ``member`` is 0, else ``fn(member, epoch(a), epoch(b))`` (a Python call per such record)."""
    return FieldSpec("call", (member, a, b), fn)


def decoder(mirror: Mirror, cls: type, **fields: FieldSpec) -> Any:
    """The C decoder of ``mirror``'s records into ``cls`` events, every field of ``cls`` given; None when the
    extension is not built. Raises TypeError when ``cls`` is not a frozen, slotted dataclass whose ``__init__`` only
    stores its arguments (``otel_ebpf.core.frozen.fast_init``), or a field is missing or unknown."""
    if not has_fast_init(cls):
        raise TypeError(f"decoder: {cls.__name__} is not a fast_init frozen slotted dataclass")
    names = [f.name for f in dataclasses.fields(cls)]
    if set(fields) != set(names):
        raise TypeError(f"decoder: {cls.__name__} fields {sorted(set(names) ^ set(fields))} missing or unknown")
    if _recdec is None:
        return None
    return _recdec.Decoder(cls, mirror.size, [_field(mirror, name, fields[name]) for name in names])


def _field(mirror: Mirror, name: str, spec: FieldSpec) -> tuple[str, int, int, int, Any, int, int]:
    if spec.op == "const":
        return (name, _recdec.OP_CONST, 1, 0, spec.arg, 0, 0)
    off, size, code = mirror.offset(spec.members[0])
    if code not in "bBhHiIqQ":
        raise TypeError(f"decoder: {mirror.c_struct}.{spec.members[0]} is not an integer ({code!r})")
    if spec.op == "call":
        (off2, _, _), (off3, _, _) = mirror.offset(spec.members[1]), mirror.offset(spec.members[2])
        return (name, _recdec.OP_CALL, size, off, spec.arg, off2, off3)
    op = {"int": _recdec.OP_SINT if code.islower() else _recdec.OP_UINT, "bool": _recdec.OP_BOOL,
          "epoch": _recdec.OP_EPOCH, "index": _recdec.OP_INDEX}[spec.op]
    if spec.op == "epoch" and code != "Q":
        raise TypeError(f"decoder: {mirror.c_struct}.{spec.members[0]} is not a u64 time")
    return (name, op, size, off, spec.arg, 0, 0)


class RecordDecoders:
    """A receiver's C decoders by record type byte. Thread-safe (no state between calls)."""

    def __init__(self, decoders: Mapping[int, Any]) -> None:
        self._records = _recdec.Records(dict(decoders)) if _recdec is not None else None

    @property
    def native(self) -> bool:
        return self._records is not None

    def decode(self, records: list[bytes], offset_ns: int, seen: Container[int]) -> tuple[list[object], int, list[int]]:
        """(items, handed back, new pids): each record's event in order, a record it did not decode left as its
        bytes (``handed back`` of them); the pids of the events not in ``seen``, each once. Only when
        :attr:`native`."""
        assert self._records is not None
        items, back, pids = self._records.decode(records, offset_ns, seen)
        return items, back, pids
