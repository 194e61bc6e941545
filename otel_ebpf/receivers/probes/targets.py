"""Checking that what a probe entry names exists on this host, before anything is loaded.

* uprobe/uretprobe: the library (absolute path, or a name resolved through ld.so.cache like
  BCC does) and the symbol in its ELF symbol tables (BCC's ``bcc_resolve_symname``).
* usdt: the probe in the file's ``.note.stapsdt`` (:mod:`.usdt`), with readable arguments at
  every index the entry captures.
* tracepoint: ``events/<category>/<name>/format`` under tracefs, and every named field, with a
  type the declared one can hold (integers and pointers for scalars; ``char *`` or ``char[N]``
  for ``str[N]``).

Every failure is a ConfigError naming the key path, e.g.
``receivers.probes.probes[2].symbol``.
"""
from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from otel_ebpf.core.errors import ConfigError, OtelEbpfError

from .config import ProbeSpec, parse_type
from otel_ebpf.bpf.usdt import Site, UsdtError, find_site

__all__ = ["TRACEFS_DIRS", "Resolved", "TpField", "resolve", "resolve_all", "tracepoint_fields"]

TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
_FIELD = re.compile(r"\s*field:(?P<decl>[^;]+);\s*offset:(?P<off>\d+);\s*size:(?P<size>\d+);"
                    r"\s*signed:(?P<signed>\d);")


@dataclass(frozen=True)
class TpField:
    """One tracepoint field from its format file."""

    name: str
    decl: str
    offset: int
    size: int
    signed: bool

    @property
    def is_char_array(self) -> bool:
        return bool(re.fullmatch(r"(const\s+)?(unsigned\s+)?char\s+\w+\[\d+\]", self.decl.strip()))

    @property
    def is_char_pointer(self) -> bool:
        return bool(re.fullmatch(r"(const\s+)?(unsigned\s+)?char\s*\*\s*\w+", self.decl.strip()))

    @property
    def is_scalar(self) -> bool:
        d = self.decl.strip()
        return "[" not in d and "__data_loc" not in d and not d.startswith("struct ") and self.size in (1, 2, 4, 8)


@dataclass
class Resolved:
    """What a validated entry attaches to."""

    spec: ProbeSpec
    path: str = ""  # real path of the library (uprobe, usdt)
    sites: list[Site] = field(default_factory=list)  # usdt locations
    fields: dict[str, TpField] = field(default_factory=dict)  # tracepoint fields


def tracepoint_fields(category: str, name: str) -> dict[str, TpField] | None:
    """The fields of tracepoint category:name, or None when it does not exist."""
    for d in TRACEFS_DIRS:
        fmt = Path(d) / "events" / category / name / "format"
        try:
            text = fmt.read_text()
        except OSError:
            continue
        out = {}
        for m in _FIELD.finditer(text):
            decl = m.group("decl").strip()
            fname = re.sub(r"\[.*\]$", "", decl).split()[-1].lstrip("*")
            out[fname] = TpField(fname, decl, int(m.group("off")), int(m.group("size")), m.group("signed") == "1")
        return out
    return None


def _library(spec: ProbeSpec, path: str) -> str:
    lib = spec.library
    if "/" in lib:
        if not os.path.isfile(lib):
            raise ConfigError(f"{path}.library", f"{lib}: no such file")
        return os.path.realpath(lib)
    from otel_ebpf.bpf.loader import import_bcc

    found = import_bcc().BPF.find_library(lib)
    if not found:
        raise ConfigError(f"{path}.library", f"library {lib!r} not found in ld.so.cache; give its absolute path")
    return os.path.realpath(found.decode() if isinstance(found, bytes) else found)


def _symbol(spec: ProbeSpec, lib: str, path: str) -> None:
    from otel_ebpf.bpf.loader import import_bcc

    try:
        import_bcc().BPF._check_path_symbol(lib, spec.symbol, None, -1)
    except OtelEbpfError:
        raise
    except Exception:
        raise ConfigError(f"{path}.symbol", f"symbol {spec.symbol!r} not found in {lib}") from None


def _tracepoint(spec: ProbeSpec, path: str) -> dict[str, TpField]:
    cat, _, name = spec.tracepoint.partition(":")
    fields = tracepoint_fields(cat, name)
    if fields is None:
        raise ConfigError(f"{path}.tracepoint", f"tracepoint {spec.tracepoint} does not exist here (no "
                                                f"events/{cat}/{name}/format under {' or '.join(TRACEFS_DIRS)})")
    for i, a in enumerate(spec.args):
        where = f"{path}.args[{i}]"
        f = fields.get(a.field)
        if f is None or f.name.startswith("common_"):
            have = ", ".join(k for k in fields if not k.startswith("common_"))
            raise ConfigError(f"{where}.field", f"{spec.tracepoint} has no field {a.field!r} (fields: {have})")
        kind, _n = parse_type(a.type, f"{where}.type")
        if kind == "str" and not (f.is_char_pointer or f.is_char_array):
            raise ConfigError(f"{where}.type", f"field {a.field} is '{f.decl}', not a char * or char[N] string")
        if kind != "str" and not f.is_scalar:
            raise ConfigError(f"{where}.type", f"field {a.field} is '{f.decl}': only integer and pointer fields "
                                               "are captured as scalars")
    return fields


def resolve(spec: ProbeSpec, path: str) -> Resolved:
    """Check one entry against this host; ConfigError names the key at fault."""
    if spec.kind == "tracepoint":
        return Resolved(spec, fields=_tracepoint(spec, path))
    lib = _library(spec, path)
    if spec.kind in ("uprobe", "uretprobe"):
        _symbol(spec, lib, path)
        return Resolved(spec, path=lib)
    try:
        sites = find_site(lib, spec.provider, spec.probe)
    except UsdtError as exc:
        raise ConfigError(f"{path}.probe", str(exc)) from None
    for i, a in enumerate(spec.args):
        for s in sites:
            if a.index >= len(s.args):
                raise ConfigError(f"{path}.args[{i}].index",
                                  f"{spec.provider}:{spec.probe} in {lib} has {len(s.args)} arguments, "
                                  f"index {a.index} is out of range")
    return Resolved(spec, path=lib, sites=sites)


def resolve_all(specs: Sequence[ProbeSpec], path: str) -> list[Resolved]:
    return [resolve(s, f"{path}[{i}]") for i, s in enumerate(specs)]
