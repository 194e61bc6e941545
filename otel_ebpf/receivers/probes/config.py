"""Configuration of user-declared probes (``receivers: {probes: {probes: [...]}}``).

Every entry is checked here, before any BPF program exists: names are identifiers, types
come from a closed list (:data:`SCALAR_TYPES`, ``str[N]``), argument positions fit the
x86-64 SysV calling convention, and - in :meth:`Config.validate` - the library, symbol, USDT
probe or tracepoint (and its fields) exist on this host (:mod:`.targets`). The BPF program is
generated (:mod:`.codegen`) only from what passed: identifiers matching :data:`IDENT`,
integers and whitelisted type names, so a config cannot inject C.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from otel_ebpf.core.config import doc, key_path
from otel_ebpf.core.errors import ConfigError

__all__ = ["IDENT", "MAX_ARGS", "MAX_DATA", "MAX_PROBES", "MAX_STR", "REG_ARGS", "SCALAR_TYPES", "ArgSpec",
           "Config", "ProbeSpec", "parse_type"]

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# ELF symbols as the uprobe API takes them (C, mangled C++, versioned foo@@GLIBC_2.2.5, foo.cold).
SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_.$]{0,254}(@@?[A-Za-z0-9_.]{1,64})?")
# name -> (C storage type, size in bytes, signed)
SCALAR_TYPES: dict[str, tuple[str, int, bool]] = {
    "u8": ("u8", 1, False), "u16": ("u16", 2, False), "u32": ("u32", 4, False), "u64": ("u64", 8, False),
    "s8": ("s8", 1, True), "s16": ("s16", 2, True), "s32": ("s32", 4, True), "s64": ("s64", 8, True),
    "bool": ("u8", 1, False), "pointer": ("u64", 8, False),
}
_STR = re.compile(r"str\[([0-9]{1,3})\]")
MAX_STR = 256
MAX_ARGS = 8
MAX_DATA = 512  # bytes of captured arguments per record (BPF stack and record size)
MAX_PROBES = 32
REG_ARGS = 6  # x86-64 SysV: rdi rsi rdx rcx r8 r9; stack arguments are not read
_FLOATS = ("float", "double", "f32", "f64", "long double")


def parse_type(text: str, path: str) -> tuple[str, int]:
    """('scalar name' or 'str', size) of a declared type; ConfigError otherwise."""
    if text in SCALAR_TYPES:
        return text, SCALAR_TYPES[text][1]
    m = _STR.fullmatch(text)
    if m:
        n = int(m.group(1))
        if not 1 <= n <= MAX_STR:
            raise ConfigError(path, f"str[N] needs 1 <= N <= {MAX_STR}, got {n}")
        return "str", n
    if text.strip().lower() in _FLOATS:
        raise ConfigError(path, f"{text!r}: BPF has no floating point; capture the raw bits as u64 (double) "
                                "or u32 (float) and convert downstream")
    raise ConfigError(path, f"unknown type {text!r}; known: {', '.join(SCALAR_TYPES)}, str[N] (N <= {MAX_STR})")


@dataclass
class ArgSpec:
    """One captured argument."""

    name: str = doc("", "Attribute name: the span/metric attribute is probe.arg.<name>. An identifier.")
    type: str = doc("u64", "u8..u64, s8..s64, bool, pointer (hex), or str[N] (N <= 256, a NUL-terminated "
                           "user-space string read with bpf_probe_read_user_str). No floating point.")
    index: int = doc(-1, "uprobe/usdt: 0-based argument position (uprobe: 0..5, the registers of the "
                         "x86-64 SysV convention; stack arguments are not supported).")
    field: str = doc("", "tracepoint: the field of the tracepoint's format to capture.")
    retval: bool = doc(False, "uretprobe, or uprobe with span: capture the return value (register rax).")

    def validate(self, path: str) -> None:
        if not IDENT.fullmatch(self.name):
            raise ConfigError(f"{path}.name", f"must be an identifier ([A-Za-z_][A-Za-z0-9_]*, <= 64), "
                                              f"got {self.name!r}")
        parse_type(self.type, f"{path}.type")
        if self.field and not IDENT.fullmatch(self.field):
            raise ConfigError(f"{path}.field", f"must be an identifier, got {self.field!r}")
        sources = (self.index >= 0) + bool(self.field) + self.retval
        if sources != 1:
            raise ConfigError(path, "give exactly one of index, field or retval")
        if self.retval and self.type.startswith("str"):
            raise ConfigError(f"{path}.type", "a return value is captured as a scalar, not a string")

    @property
    def size(self) -> int:
        """Bytes in the record: scalars are stored as 8 bytes, strings rounded up to 8."""
        kind, n = parse_type(self.type, "")
        return 8 if kind != "str" else (n + 7) & ~7


@dataclass
class ProbeSpec:
    """One user-declared probe."""

    name: str = doc("", "Span / metric name, and the key of this probe. An identifier.")
    kind: Literal["uprobe", "uretprobe", "usdt", "tracepoint"] = doc("uprobe", "What to attach.")
    library: str = doc("", "uprobe/uretprobe/usdt: an absolute path, or a library name found like BCC "
                           "does (ldconfig: 'c', 'libfoo.so.1').")
    symbol: str = doc("", "uprobe/uretprobe: the function's ELF symbol (mangled for C++).")
    provider: str = doc("", "usdt: the probe's provider.")
    probe: str = doc("", "usdt: the probe's name.")
    tracepoint: str = doc("", "tracepoint: 'category:name' as under /sys/kernel/tracing/events.")
    args: list[ArgSpec] = doc([], f"Arguments to capture (at most {MAX_ARGS}, {MAX_DATA} bytes in all).")
    span: bool = doc(False, "uprobe only: pair entry and return into one span with its duration.")
    metric: Literal["none", "count", "histogram"] = doc(
        "count", "count: a counter <name> {call}; histogram: <name> as a histogram of the arg named by "
                 "'value', or of the duration in seconds (span: true) when 'value' is empty; none.")
    value: str = doc("", "histogram: the scalar argument whose values are recorded.")

    def validate(self, path: str) -> None:
        self._validate_target(path)
        if len(self.args) > MAX_ARGS:
            raise ConfigError(f"{path}.args", f"at most {MAX_ARGS} arguments, got {len(self.args)}")
        seen: set[str] = set()
        for i, a in enumerate(self.args):
            self._validate_arg(a, f"{path}.args[{i}]")
            if a.name in seen:
                raise ConfigError(f"{path}.args[{i}].name", f"duplicate argument name {a.name!r}")
            seen.add(a.name)
        total = sum(a.size for a in self.args)
        if total > MAX_DATA:
            raise ConfigError(f"{path}.args", f"captured arguments take {total} bytes, at most {MAX_DATA}")
        self._validate_output(path, seen)

    def _validate_target(self, path: str) -> None:
        if not IDENT.fullmatch(self.name):
            raise ConfigError(f"{path}.name", f"must be an identifier ([A-Za-z_][A-Za-z0-9_]*, <= 64), "
                                              f"got {self.name!r}")
        need = {"uprobe": ("library", "symbol"), "uretprobe": ("library", "symbol"),
                "usdt": ("library", "provider", "probe"), "tracepoint": ("tracepoint",)}[self.kind]
        for key in ("library", "symbol", "provider", "probe", "tracepoint"):
            if key in need and not getattr(self, key):
                raise ConfigError(f"{path}.{key}", f"required for kind {self.kind}")
            if key not in need and getattr(self, key):
                raise ConfigError(f"{path}.{key}", f"not used by kind {self.kind}")
        if self.symbol and not SYMBOL.fullmatch(self.symbol):
            raise ConfigError(f"{path}.symbol", f"not a valid ELF symbol name: {self.symbol!r}")
        for key in ("provider", "probe"):
            if getattr(self, key) and not IDENT.fullmatch(getattr(self, key)):
                raise ConfigError(f"{path}.{key}", f"must be an identifier, got {getattr(self, key)!r}")
        if self.tracepoint:
            cat, _, tp = self.tracepoint.partition(":")
            if not (IDENT.fullmatch(cat) and IDENT.fullmatch(tp)):
                raise ConfigError(f"{path}.tracepoint", f"must be 'category:name' (identifiers), "
                                                        f"got {self.tracepoint!r}")
        if self.library and ("\0" in self.library or "\n" in self.library or len(self.library) > 4096):
            raise ConfigError(f"{path}.library", "not a usable path or library name")
        if self.span and self.kind != "uprobe":
            raise ConfigError(f"{path}.span", f"spans pair a uprobe with its return; kind {self.kind} is a "
                                              "single point (use metric)")

    def _validate_arg(self, a: ArgSpec, path: str) -> None:
        if self.kind == "tracepoint":
            if not a.field:
                raise ConfigError(path, "tracepoint arguments are named by 'field'")
            return
        if a.field:
            raise ConfigError(f"{path}.field", f"'field' is for tracepoints, not {self.kind}")
        if a.retval and not (self.kind == "uretprobe" or self.span):
            raise ConfigError(f"{path}.retval", "the return value exists only for a uretprobe or a uprobe "
                                                "with span: true")
        if self.kind == "uretprobe" and not a.retval:
            raise ConfigError(f"{path}.index", "a uretprobe sees only the return value (argument registers "
                                               "are overwritten by then): use retval: true, or a uprobe "
                                               "with span: true")
        if self.kind == "uprobe" and a.index >= REG_ARGS:
            raise ConfigError(f"{path}.index", f"argument {a.index} is not in a register (x86-64 SysV passes "
                                               f"{REG_ARGS} in registers); stack arguments are not supported")
        if self.kind == "usdt" and a.index >= 12:
            raise ConfigError(f"{path}.index", f"USDT probes have at most 12 arguments, got index {a.index}")

    def _validate_output(self, path: str, names: set[str]) -> None:
        if self.value:
            if self.value not in names:
                raise ConfigError(f"{path}.value", f"no argument named {self.value!r}")
            arg = next(a for a in self.args if a.name == self.value)
            if arg.type.startswith("str"):
                raise ConfigError(f"{path}.value", "a histogram needs a scalar argument")
            if self.metric != "histogram":
                raise ConfigError(f"{path}.value", "only used with metric: histogram")
        if self.metric == "histogram" and not self.value and not self.span:
            raise ConfigError(f"{path}.metric", "histogram of what? give 'value' (an argument) or span: true "
                                                "(the duration)")
        if self.metric == "none" and not self.span:
            raise ConfigError(f"{path}.metric", "with span: false and metric: none the probe produces nothing")


@dataclass
class Config:
    """Every default lives here and is documented here."""

    probes: list[ProbeSpec] = doc([], f"User-declared probes (at most {MAX_PROBES}); empty: nothing is loaded.")
    ringbuf_pages: int = doc(64, "Ring buffer size in pages; a full buffer drops records "
                                 "(otel_ebpf.events.dropped{reason=ringbuf_full}).", pow2=True)
    max_inflight: int = doc(8192, "Calls in progress tracked per span probe (entry seen, return not yet). "
                                  "Beyond it calls are not traced (reason=state_map_full).", min=1)
    poll_interval: float = doc(0.1, "Longest wait for ring-buffer records per poll round.", duration=True, min=0.001)
    check_targets: bool = doc(True, "Check at config time that every library, symbol, USDT probe and "
                                    "tracepoint field exists on this host (false: only at start).")

    def validate(self, path: str) -> None:
        if len(self.probes) > MAX_PROBES:
            raise ConfigError(key_path(path, "probes"), f"at most {MAX_PROBES} probes, got {len(self.probes)}")
        names: set[str] = set()
        for i, p in enumerate(self.probes):
            if p.name in names:
                raise ConfigError(key_path(path, f"probes[{i}].name"), f"duplicate probe name {p.name!r}")
            names.add(p.name)
        if self.check_targets and self.probes:
            from .targets import resolve_all

            resolve_all(self.probes, key_path(path, "probes"))
