"""USDT probe sites read from a binary's ELF notes (through BCC), and the BPF C that reads
their arguments.

A USDT argument is an operand chosen by the compiler (``8@%rdi``, ``-4@12(%rsp)``, ``$5``).
:func:`find_site` returns every location of ``provider:name`` in a file with its arguments as
:class:`ArgLoc`; :func:`arg_reader` turns one location's arguments into C statements. The
only text it emits is built from integers and register names looked up in :data:`REGISTERS`
(pt_regs fields of x86-64), never from strings read out of the file. Semaphore and probe
addresses are converted from ELF virtual addresses to file offsets (what uprobes take).

Nothing here raises for a missing probe except :class:`UsdtError`, whose message names the
file and the probe.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_ebpf.bpf.loader import import_bcc
from otel_ebpf.host.symbols import load_segments

__all__ = ["REGISTERS", "ArgLoc", "Site", "UsdtError", "arg_reader", "find_site", "list_probes",
           "vaddr_to_offset"]

# x86-64 register names as written in USDT notes -> struct pt_regs field (BCC's uapi ptrace.h).
REGISTERS: dict[str, str] = {}
for _full, _field in (("rax", "ax"), ("rbx", "bx"), ("rcx", "cx"), ("rdx", "dx"), ("rsi", "si"),
                      ("rdi", "di"), ("rbp", "bp"), ("rsp", "sp"), ("rip", "ip")):
    REGISTERS[_full] = _field
    REGISTERS["e" + _full[1:]] = _field  # eax ...
for _n in range(8, 16):
    for _suffix in ("", "d", "w", "b"):
        REGISTERS[f"r{_n}{_suffix}"] = f"r{_n}"
for _short, _field in (("ax", "ax"), ("bx", "bx"), ("cx", "cx"), ("dx", "dx"), ("si", "si"), ("di", "di"),
                       ("al", "ax"), ("bl", "bx"), ("cl", "cx"), ("dl", "dx"), ("sil", "si"), ("dil", "di")):
    REGISTERS[_short] = _field
for _field in ("bp", "sp", "ip", *(f"r{n}" for n in range(8, 16))):
    REGISTERS[_field] = _field  # BCC reports some operands by their pt_regs name

_FLAG_CONSTANT, _FLAG_DEREF_OFFSET, _FLAG_DEREF_IDENT, _FLAG_BASE, _FLAG_INDEX = 1, 2, 4, 8, 16


class UsdtError(ValueError):
    """A USDT probe that is absent or whose arguments cannot be read; the message says which."""


@dataclass(frozen=True)
class ArgLoc:
    """Where one USDT argument lives: a constant, a register, or memory at register + offset."""

    size: int  # bytes: 1, 2, 4 or 8
    signed: bool
    constant: int | None = None
    register: str | None = None  # pt_regs field
    deref_offset: int | None = None  # None: the register's value itself


@dataclass(frozen=True)
class Site:
    """One location of a probe: file offset of the probe address and its arguments."""

    path: str
    offset: int
    semaphore_offset: int  # 0: no semaphore
    args: tuple[ArgLoc, ...]


def _program_headers(path: str) -> list[tuple[int, int, int]]:
    """(p_vaddr, p_offset, max(p_filesz, p_memsz)) of each PT_LOAD segment of a 64-bit little-endian ELF."""
    try:
        return [(vaddr, offset, max(filesz, memsz)) for vaddr, offset, filesz, memsz in load_segments(path)]
    except ValueError as exc:
        raise UsdtError(str(exc)) from None


def vaddr_to_offset(path: str, vaddr: int) -> int:
    """File offset of link-time virtual address ``vaddr`` (uprobes and ref_ctr take offsets)."""
    for p_vaddr, p_offset, size in _program_headers(path):
        if p_vaddr <= vaddr < p_vaddr + size:
            return vaddr - p_vaddr + p_offset
    raise UsdtError(f"{path}: address {vaddr:#x} is in no loadable segment")


def _arg(raw: Any, where: str) -> ArgLoc:
    valid = raw.valid
    size = abs(raw.size)
    signed = raw.size < 0
    if size not in (1, 2, 4, 8):
        raise UsdtError(f"{where}: argument size {size} is not supported")
    if valid & _FLAG_CONSTANT:
        return ArgLoc(size, signed, constant=int(raw.constant))
    if valid & (_FLAG_DEREF_IDENT | _FLAG_INDEX):
        raise UsdtError(f"{where}: arguments addressed by symbol or index register are not supported")
    name = (raw.base_register_name or b"").decode(errors="replace").lstrip("%")
    field = REGISTERS.get(name)
    if field is None:
        raise UsdtError(f"{where}: register {name!r} is not supported")
    off = int(raw.deref_offset) if valid & _FLAG_DEREF_OFFSET else None
    return ArgLoc(size, signed, register=field, deref_offset=off)


def _context(path: str) -> tuple[Any, Any]:
    """BCC's USDT context of ``path`` and the bcc.libbcc module."""
    import_bcc()
    from bcc import libbcc, usdt

    if not Path(path).is_file():
        raise UsdtError(f"{path}: no such file")
    return usdt.USDT(path=path), libbcc


def list_probes(path: str) -> list[str]:
    """'provider:name' of every USDT probe in ``path``."""
    ctx, _ = _context(path)
    return sorted(p.short_name() for p in ctx.enumerate_probes())


def find_site(path: str, provider: str, name: str) -> list[Site]:
    """Every location of USDT probe ``provider:name`` in ``path``; UsdtError when absent."""
    ctx, libbcc = _context(path)
    import ctypes as ct

    for probe in ctx.enumerate_probes():
        if probe.provider.decode() != provider or probe.name.decode() != name:
            continue
        sema = vaddr_to_offset(path, probe.semaphore) if probe.semaphore else 0
        sites = []
        for i in range(probe.num_locations):
            loc = probe.get_location(i)
            args = []
            for j in range(probe.num_arguments):
                raw = libbcc.bcc_usdt_argument()
                if libbcc.lib.bcc_usdt_get_argument(probe.context, probe.provider, probe.name, i, j,
                                                    ct.byref(raw)) != 0:
                    raise UsdtError(f"{path}: {provider}:{name} location {i} argument {j} cannot be read")
                args.append(_arg(raw, f"{path}: {provider}:{name} argument {j + 1}"))
            sites.append(Site(path, vaddr_to_offset(path, loc.address), sema, tuple(args)))
        return sites
    have = ", ".join(list_probes(path)) or "none"
    raise UsdtError(f"{path} has no USDT probe {provider}:{name} (it has: {have[:500]})")


def arg_reader(site: Site, index: int, dest: str) -> str:
    """C statements that store argument ``index`` (0-based) of ``site`` into the u64 lvalue
    ``dest`` (an identifier chosen by the caller, not user input), sign-extended when signed.
    Reads from memory use bpf_probe_read_user; a failed read leaves 0."""
    a = site.args[index]
    ctype = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}[a.size]
    stype = ctype.replace("u", "s")
    if a.constant is not None:
        return f"{dest} = (u64)({int(a.constant)}LL);"
    if a.deref_offset is None:
        val = f"ctx->{a.register}"
        return f"{dest} = (u64)({stype})({ctype})({val});" if a.signed else f"{dest} = (u64)({ctype})({val});"
    tmp = f"{dest}_m"
    cast = f"(u64)({stype}){tmp}" if a.signed else f"(u64){tmp}"
    return (f"{{ {ctype} {tmp} = 0; bpf_probe_read_user(&{tmp}, sizeof({tmp}), "
            f"(void *)(ctx->{a.register} + ({int(a.deref_offset)}))); {dest} = {cast}; }}")
