"""Stub libraries for the CUDA-toolkit libraries the torch wheel links, derived from the installed wheel.

torch's libraries name libcublas, libcudnn, libcufft... as DT_NEEDED; the dynamic loader refuses to start
without them, and every symbol torch imports from them must resolve (eager binding of versioned symbols).
The twin never runs their code paths that matter (kernels do nothing), so each stub has the right SONAME,
the version nodes torch's imports name, and every imported symbol as a function returning 0 (every CUDA
library's ``*_SUCCESS``). The few functions torch calls on import or on first use and whose out-parameters
it reads get real bodies in ``stub_overrides.c``.

What is derived from the wheel at build time (nothing is a stored list): the libraries to stub (DT_NEEDED
names that torch does not ship, but for the C/C++ runtime and the twin's hand-written stand-ins); the
symbols (``nm -D --undefined-only``); which library a versioned symbol comes from (``readelf -V`` "Version
needs"). Unversioned symbols (libcuda, libcurand, libcufile, libcusparseLt, libnvshmem_host carry no
version nodes) go to the needed library whose API prefix they carry (``PREFIXES``).

Not thread-safe (writes files); blocking (runs nm/readelf). Raises ``TwinBuildError`` naming a missing tool.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from otel_ebpf.twin.errors import TwinBuildError

__all__ = ["STAND_INS", "StubLibrary", "plan_stubs", "torch_libraries", "undefined_symbols", "write_stub_sources"]

STAND_INS = frozenset({"libcudart.so.13", "libnccl.so.2"})  # written by hand: cudart*.c, nccl_*.c
# The C and C++ runtime: the only needed libraries taken from the system. Anything else is stubbed even when
# the host has it (a CUDA toolkit in ldconfig's cache), so a twin run is the same on every machine.
RUNTIME = ("libc.so.", "libm.so.", "libdl.so.", "librt.so.", "libpthread.so.", "ld-linux", "libstdc++.so.",
           "libgcc_s.so.", "libgomp.so.")
# API prefixes of the unversioned libraries' symbols (their headers: cuda.h cu*, curand.h curand*, cufile.h
# cuFile*, cusparseLt.h cusparseLt*, nvshmem.h nvshmem*); the longest match among a library's needs wins.
PREFIXES = {"libcuda.so.1": "cu", "libcurand.so.10": "curand", "libcufile.so.0": "cuFile",
            "libcusparseLt.so.0": "cusparseLt", "libnvshmem_host.so.3": "nvshmem"}
_VERSION_NEED = re.compile(r"File:\s*(\S+)\s+Cnt:.*?(?=\n\s*(?:0x)?[0-9a-f]+:\s*Version:|\Z)", re.S)


@dataclass
class StubLibrary:
    """One stub: its soname and each symbol with the version node it is imported under (None: unversioned)."""

    soname: str
    symbols: dict[str, str | None] = field(default_factory=dict)

    def versions(self) -> list[str]:
        return sorted({v for v in self.symbols.values() if v is not None})


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise TwinBuildError(f"the twin's build needs `{name}` (binutils: apt-get install binutils)")
    return path


def _run(args: list[str]) -> str:
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def torch_libraries(torch_dir: Path) -> list[Path]:
    """The shared objects of the torch wheel: torch/lib/*.so* and the extension modules in torch/."""
    return sorted(p for p in [*(torch_dir / "lib").glob("*.so*"), *torch_dir.glob("*.so")] if p.is_file())


def _needed(lib: Path) -> list[str]:
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _run([_tool("readelf"), "-d", str(lib)]))


def _version_owners(lib: Path) -> dict[str, str]:
    """Version node name -> the library that must define it (readelf -V, "Version needs" section)."""
    out = _run([_tool("readelf"), "-V", "--wide", str(lib)])
    needs = out.split("Version needs section", 1)
    owners: dict[str, str] = {}
    if len(needs) == 2:
        for m in _VERSION_NEED.finditer(needs[1]):
            for name in re.findall(r"Name:\s*(\S+)", m.group(0)):
                owners[name] = m.group(1)
    return owners


def undefined_symbols(lib: Path) -> list[str]:
    """Undefined, non-weak dynamic symbols, as ``name`` or ``name@version``."""
    lines = _run([_tool("nm"), "-D", "--undefined-only", str(lib)]).splitlines()
    return [parts[-1] for parts in (ln.split() for ln in lines) if len(parts) >= 2 and parts[-2] == "U"]


def _is_runtime(soname: str) -> bool:
    return soname.startswith(RUNTIME)


def _owner_by_prefix(symbol: str, candidates: list[str]) -> str | None:
    best = [s for s in candidates if symbol.startswith(PREFIXES.get(s, "\0"))]
    return max(best, key=lambda s: len(PREFIXES[s])) if best else None


def plan_stubs(torch_dir: Path) -> dict[str, StubLibrary]:
    """Every library to stub, with the symbols torch imports from it (soname -> StubLibrary)."""
    libs = torch_libraries(torch_dir)
    shipped = {p.name for p in libs}
    plan: dict[str, StubLibrary] = {}
    needs: dict[Path, list[str]] = {}
    for lib in libs:
        needs[lib] = [n for n in _needed(lib) if n not in shipped and not _is_runtime(n) and n not in STAND_INS]
        for soname in needs[lib]:
            plan.setdefault(soname, StubLibrary(soname))
    for lib in libs:
        owners = _version_owners(lib)
        unversioned = [s for s in needs[lib] if s not in owners.values()]
        for sym in undefined_symbols(lib):
            name, _, version = sym.partition("@")
            version = version.lstrip("@")
            owner = owners.get(version) if version else _owner_by_prefix(name, unversioned)
            if owner in plan:
                plan[owner].symbols[name] = version or None
    return plan


def _overrides(text: str) -> dict[str, str]:
    """stub_overrides.c split at its ``/* @@ soname */`` markers."""
    return {m.group(1): m.group(2) for m in re.finditer(r"/\* @@ (\S+) \*/(.*?)(?=/\* @@ |\Z)", text, re.S)}


def write_stub_sources(plan: dict[str, StubLibrary], overrides: str, out_dir: Path) -> list[tuple[str, Path, Path]]:
    """Writes each stub's C source and linker version script; returns (soname, source, version script)."""
    bodies = _overrides(overrides)
    written = []
    for soname, stub in sorted(plan.items()):
        body = bodies.get(soname, "")
        defined = set(re.findall(r"^[A-Za-z_][\w ]*[\s*]+(\w+)\s*\([^;{]*\)\s*\{", body, re.M))
        lines = [f"/* generated by otel_ebpf/twin/stubs.py for {soname}: {len(stub.symbols)} symbols */",
                 "#include <stddef.h>", "#include <string.h>", body]
        lines += [f"long {s}(void) {{ return 0; }}" for s in sorted(stub.symbols) if s not in defined]
        source = out_dir / f"stub-{soname}.c"
        source.write_text("\n".join(lines) + "\n")
        by_version: dict[str, list[str]] = defaultdict(list)
        for sym, version in stub.symbols.items():
            if version is not None:
                by_version[version].append(sym)
        nodes = [f"{v} {{ global: {' '.join(f'{s};' for s in sorted(syms))} }};"
                 for v, syms in sorted(by_version.items())]
        script = out_dir / f"stub-{soname}.map"
        script.write_text("\n".join(nodes or ["{ global: *; };"]) + "\n")
        written.append((soname, source, script))
    return written
