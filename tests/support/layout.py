"""Checks a BPF header's structs and constants against their Python mirrors, as gcc lays them out.

:func:`measure` writes a small C program that includes the header (after a shim typedef'ing the
kernel's u8/s16/u16/u32/s32/u64/s64), prints ``sizeof`` of each struct, ``offsetof`` and
``sizeof`` of each named member (a member designator: ``call.pid``, ``grid[1]``) and the value
of each integer expression, builds it with ``gcc -Wall -Werror`` and reads the numbers back.
:func:`assert_mirror` compares a little-endian, padding-explicit ``struct`` format and its field
names with what gcc measured; :func:`assert_members` does the same for (name, offset, size)
triples from any other mirror shape.

gcc is a test dependency (scripts/setup.sh installs it): without it the checks fail, never skip.
"""
from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_ebpf.bpf.records import format_offsets

__all__ = ["SHIM", "CLayout", "assert_members", "assert_mirror", "format_offsets", "measure"]

SHIM = ("typedef unsigned char u8; typedef short s16; typedef unsigned short u16; typedef unsigned int u32; "
        "typedef int s32; typedef unsigned long long u64; typedef long long s64;\n")


@dataclass(frozen=True)
class CLayout:
    """What gcc measured: ``sizes[struct]``, ``members[(struct, member)] = (offset, size)`` and
    ``values[name]`` for each requested integer expression."""

    sizes: dict[str, int]
    members: dict[tuple[str, str], tuple[int, int]]
    values: dict[str, int]


def measure(folder: Path, header: str, workdir: Path, *, structs: Mapping[str, Sequence[str]] | None = None,
            values: Mapping[str, str] | Sequence[str] = (), shim: str = SHIM) -> CLayout:
    """Build and run the probe program for ``folder/header`` in ``workdir``: ``structs`` maps a
    struct name to the members to measure, ``values`` a result name to a C integer expression
    (``{"dev_val": "sizeof(struct blk_dev_val)"}``) or lists expressions named by themselves
    (``["BLK_SLOTS"]``)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail(f"gcc is needed to check {header} against its Python mirrors")
    structs = structs or {}
    exprs = dict(values) if isinstance(values, Mapping) else {v: v for v in values}
    lines = []
    for name, members in structs.items():
        lines.append(f'printf("%zu\\n", sizeof(struct {name}));')
        for m in members:
            lines.append(f'printf("%zu %zu\\n", __builtin_offsetof(struct {name}, {m}), '
                         f'sizeof(((struct {name} *)0)->{m}));')
    lines += [f'printf("%lld\\n", (long long)({expr}));' for expr in exprs.values()]
    src = (f'#include <stdio.h>\n{shim}#include "{header}"\nint main(void)\n{{\n    '
           + "\n    ".join(lines) + "\n    return 0;\n}\n")
    c_file, exe = workdir / "layout.c", workdir / "layout"
    c_file.write_text(src)
    built = subprocess.run([gcc, "-Wall", "-Werror", f"-I{folder}", "-o", str(exe), str(c_file)],
                           capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, f"gcc failed on {folder / header}:\n{built.stderr}"
    numbers = iter(subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=10)
                   .stdout.splitlines())
    sizes: dict[str, int] = {}
    member_layout: dict[tuple[str, str], tuple[int, int]] = {}
    for name, members in structs.items():
        sizes[name] = int(next(numbers))
        for m in members:
            offset, size = next(numbers).split()
            member_layout[(name, m)] = (int(offset), int(size))
    measured = {key: int(next(numbers)) for key in exprs}
    assert next(numbers, None) is None, "the probe program printed more lines than asked for"
    return CLayout(sizes, member_layout, measured)


def assert_members(c: CLayout, c_struct: str, size: int, members: Sequence[tuple[str, int, int]]) -> None:
    """The mirror of ``c_struct`` is ``size`` bytes and each (member, offset, size) is where gcc
    puts it; the mirror names every member that was measured, in order."""
    assert size == c.sizes[c_struct], f"sizeof(struct {c_struct}): Python {size}, gcc {c.sizes[c_struct]}"
    measured = [m for (s, m) in c.members if s == c_struct]
    assert [m for m, _, _ in members] == measured, c_struct
    for member, offset, msize in members:
        assert (offset, msize) == c.members[(c_struct, member)], \
            f"{c_struct}.{member}: Python (offset, size) {(offset, msize)}, gcc {c.members[(c_struct, member)]}"


def assert_mirror(c: CLayout, c_struct: str, fmt: struct.Struct, fields: Sequence[str]) -> None:
    """A ``struct`` format mirror (one field name per unpacked value) matches ``c_struct``."""
    offsets = format_offsets(fmt)
    assert len(offsets) == len(fields), f"{c_struct}: {len(offsets)} values in {fmt.format!r}, {len(fields)} names"
    assert_members(c, c_struct, fmt.size, [(f, off, size) for f, (off, size) in zip(fields, offsets, strict=True)])
