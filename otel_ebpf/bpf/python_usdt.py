"""The interpreter's USDT probes: finding them, compiling their arguments, attaching per process.

CPython built ``--with-dtrace`` (Debian, Ubuntu, Fedora) carries ``python:function__entry``
and ``python:function__return`` in the executable (or in ``libpython3.X.so`` for shared
builds), each guarded by a *semaphore*: a counter in the binary's data that CPython checks
before it does the work of firing the probe. Nothing fires while it is 0.

BCC raises semaphores only for a USDT context made from a PID, by writing ``/proc/PID/mem``
once. Here the kernel does it instead: each probe is attached as a uprobe with a *reference
counter offset* (``perf_event_open`` uprobe PMU, Linux 4.20+), filtered to one process. The
kernel raises the semaphore in exactly the processes whose uprobe it installs, including
after ``exec`` and in a library mapped later, and lowers it on detach. Other Python
processes on the host (the agent itself runs Python) never trap.

Argument locations (``8@%rbp 8@%r12 -4@%eax`` on Debian's 3.11) differ between builds. BCC
parses the stapsdt notes; :func:`arg_macros` turns them into C expressions passed as ``-D``
macros, so one program serves one interpreter build.
"""
from __future__ import annotations

import ctypes as ct
import logging
import os
from dataclasses import dataclass
from typing import Any

from otel_ebpf.bpf.usdt import vaddr_to_offset
from otel_ebpf.core.errors import TargetError

__all__ = ["PROBE_NAMES", "ArgSpec", "NoUsdtError", "UsdtSite", "arg_macros", "attach_site", "find_sites"]

log = logging.getLogger(__name__)
PROBE_NAMES = ("function__entry", "function__return")
NO_USDT_HINT = ("use an interpreter built with USDT probes (--with-dtrace: the python3 packages of "
                "Debian, Ubuntu and Fedora, e.g. /usr/bin/python3), or trace without them: the "
                "'torch' receiver (operator uprobes in libtorch) or uprobes on the interpreter's "
                "_PyEval_EvalFrameDefault")

# bcc_usdt_argument.valid flags (bcc/libbcc.py BCC_USDT_ARGUMENT_FLAGS)
_CONSTANT, _DEREF_OFFSET, _DEREF_IDENT, _BASE_REG, _INDEX_REG, _SCALE = 1, 2, 4, 8, 16, 32
_PT_REGS = {"ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "ip", "r8", "r9", "r10", "r11", "r12", "r13",
            "r14", "r15"}


class NoUsdtError(TargetError):
    """The interpreter has no ``python:function__entry/return`` probes."""

    def __init__(self, path: str, detail: str = "no python:function__entry/function__return USDT probes") -> None:
        super().__init__(f"{path}: {detail} (built without --with-dtrace; readelf -n shows no stapsdt notes)",
                         hint=NO_USDT_HINT)
        self.path = path


@dataclass(frozen=True)
class ArgSpec:
    """One USDT argument as BCC parsed it: ``size`` bytes (negative: signed) read from a register
    (``base``), from memory at ``base + offset (+ index * scale)``, or a constant."""

    size: int
    base: str | None = None
    offset: int | None = None
    index: str | None = None
    scale: int = 1
    constant: int | None = None


@dataclass(frozen=True)
class UsdtSite:
    """A probe in ``path``: its file offsets (location, semaphore; 0 = no semaphore) and args."""

    path: str
    name: str
    offset: int
    semaphore_offset: int
    args: tuple[ArgSpec, ...]


def _arg(raw: Any) -> ArgSpec:
    valid = raw.valid
    if valid & _CONSTANT:
        return ArgSpec(raw.size, constant=raw.constant)
    if valid & _DEREF_IDENT or not valid & _BASE_REG:
        raise ValueError("argument refers to a symbol (RIP-relative), which is not supported")
    base = raw.base_register_name.decode()
    index = raw.index_register_name.decode() if valid & _INDEX_REG else None
    for reg in (base, index):
        if reg is not None and reg not in _PT_REGS:
            raise ValueError(f"register {reg!r} is not an x86-64 pt_regs field")
    offset = raw.deref_offset if valid & _DEREF_OFFSET else None
    return ArgSpec(raw.size, base, offset, index, raw.scale if valid & _SCALE else 1)


def find_sites(path: str) -> dict[str, UsdtSite]:
    """``function__entry`` and ``function__return`` of the interpreter (or libpython) ``path``.

    Raises :class:`NoUsdtError` naming the file when either is missing or unusable."""
    from bcc import USDT
    from bcc.libbcc import bcc_usdt_argument, lib

    real = os.path.realpath(path)
    try:
        ctx = USDT(path=real)
        probes = {p.name.decode(): p for p in ctx.enumerate_probes() if p.provider == b"python"}
    except Exception as exc:
        raise NoUsdtError(real, f"cannot read USDT notes: {exc}") from None
    sites: dict[str, UsdtSite] = {}
    for name in PROBE_NAMES:
        probe = probes.get(name)
        if probe is None:
            raise NoUsdtError(real)
        if probe.num_locations != 1:
            raise NoUsdtError(real, f"python:{name} has {probe.num_locations} locations (one is supported)")
        loc = probe.get_location(0)
        args = []
        for i in range(probe.num_arguments):
            raw = bcc_usdt_argument()
            if lib.bcc_usdt_get_argument(ctx.context, probe.provider, probe.name, 0, i, ct.byref(raw)) != 0:
                raise NoUsdtError(real, f"python:{name} argument {i + 1} cannot be read")
            try:
                args.append(_arg(raw))
            except ValueError as exc:
                raise NoUsdtError(real, f"python:{name} argument {i + 1}: {exc}") from None
        if len(args) < 3:
            raise NoUsdtError(real, f"python:{name} has {len(args)} arguments, expected 3")
        sem = vaddr_to_offset(real, probe.semaphore) if probe.semaphore else 0
        sites[name] = UsdtSite(real, name, vaddr_to_offset(real, loc.address), sem, tuple(args))
    return sites


def _ctype(size: int) -> str:
    return {1: "u8", 2: "u16", 4: "u32", 8: "u64"}[abs(size)].replace("u", "s" if size < 0 else "u", 1)


def _expr(a: ArgSpec) -> str:
    t = _ctype(a.size)
    if a.constant is not None:
        return f"(({t}){a.constant}LL)"
    if a.offset is None:
        return f"(({t})(ctx)->{a.base})"
    addr = f"(ctx)->{a.base} + ({a.offset})"
    if a.index:
        addr += f" + (ctx)->{a.index} * {a.scale}"
    return f"({{ {t} _v = 0; bpf_probe_read_user(&_v, sizeof(_v), (void *)({addr})); _v; }})"


def arg_macros(sites: dict[str, UsdtSite]) -> list[str]:
    """``-DPY_ENTRY_FILE(ctx)=...`` etc.: the three arguments (file name pointer, function name
    pointer, line number) of both probes as C expressions."""
    flags = []
    for name, prefix in (("function__entry", "PY_ENTRY"), ("function__return", "PY_RETURN")):
        args = sites[name].args
        for arg, what in zip(args[:3], ("FILE", "FUNC", "LINE"), strict=True):
            flags.append(f"-D{prefix}_{what}(ctx)={_expr(arg)}")
    return flags


_ATTACH: Any = None


def attach_fn() -> Any:
    """libbcc's ``bpf_attach_uprobe`` with its 7th parameter, ``ref_ctr_offset`` (BCC 0.26's
    Python binding declares only six, so it is called through its own prototype here)."""
    global _ATTACH
    if _ATTACH is None:
        from bcc.libbcc import lib

        fn = ct.CDLL(lib._name).bpf_attach_uprobe
        fn.restype = ct.c_int
        fn.argtypes = [ct.c_int, ct.c_int, ct.c_char_p, ct.c_char_p, ct.c_uint64, ct.c_int, ct.c_uint32]
        _ATTACH = fn
    return _ATTACH


def attach_site(bpf: Any, site: UsdtSite, fn_name: str, pid: int) -> str:
    """Attach BPF function ``fn_name`` to ``site`` in process ``pid`` (its semaphore raised by the
    kernel). Returns the event name (detach with ``bpf.detach_uprobe_event``); raises OSError."""
    fn = bpf.load_func(fn_name.encode(), bpf.KPROBE)
    ev = f"oe_py_{pid}_{site.offset:x}".encode()
    fd = attach_fn()(fn.fd, 0, ev, site.path.encode(), site.offset, pid, site.semaphore_offset)
    if fd < 0:
        raise OSError(f"uprobe on {site.path}:{site.name} for pid {pid} failed (process gone?)")
    bpf._add_uprobe_fd(ev, fd)  # BCC's own table, so cleanup() detaches it
    return ev.decode()
