"""User-declared probes -> one BPF C program, and the Python layout of its records.

The generated text is built ONLY from: fixed templates, integers (probe numbers, argument
positions, sizes, tracefs field offsets), C type names looked up in
:data:`~.config.SCALAR_TYPES`, and pt_regs register names from :data:`~.usdt.REGISTERS`.
No string from the config (names, symbols, paths) is ever written into the program: names
stay in Python, symbols and paths go to the attach calls. :func:`generate` re-checks that
invariant and refuses to emit anything else.

Record (type :data:`UP_EV_HIT`): a 32-byte head (:data:`HEAD`) followed by one slot per
captured argument in declaration order: 8 bytes for a scalar (stored as u64, sign-extended
for signed types), N rounded up to 8 for ``str[N]``.
"""
from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from .config import SCALAR_TYPES, ArgSpec, parse_type
from .targets import Resolved, TpField

__all__ = ["HEAD", "HEAD_FIELDS", "UP_EV_HIT", "Layout", "generate", "header", "layout"]

UP_EV_HIT = 144
FLAG_SPAN = 1
HEAD = struct.Struct("<BBBxII4xQQ")
HEAD_FIELDS = ("type", "probe", "flags", "pid", "tid", "start_ns", "end_ns")
_SAFE = re.compile(r"[A-Za-z0-9_ \t\n{}()\[\];,.*&=<>!+\-/|~#:?%\"'\\]*")
_PARM = ("PT_REGS_PARM1", "PT_REGS_PARM2", "PT_REGS_PARM3", "PT_REGS_PARM4", "PT_REGS_PARM5", "PT_REGS_PARM6")


@dataclass(frozen=True)
class Layout:
    """How one probe's record is decoded: the data struct after :data:`HEAD` and, per arg,
    (name, kind, declared type)."""

    fmt: struct.Struct
    args: tuple[tuple[str, str, str], ...]


def layout(args: Sequence[ArgSpec]) -> Layout:
    parts, out = [], []
    for a in args:
        kind, _n = parse_type(a.type, "")
        parts.append("Q" if kind != "str" else f"{a.size}s")
        out.append((a.name, kind, a.type))
    return Layout(struct.Struct("<" + "".join(parts)), tuple(out))


def _slots(args: Sequence[ArgSpec]) -> str:
    lines = []
    for i, a in enumerate(args):
        kind, _ = parse_type(a.type, "")
        lines.append(f"    u64 a{i};" if kind != "str" else f"    char a{i}[{int(a.size)}];")
    return "\n".join(lines) or "    u64 _none[0];"


def header(resolved: Sequence[Resolved]) -> str:
    """The record structs (also compiled by gcc in tests/unit/test_user_probes_layout.py)."""
    out = ["struct up_head {\n    u8 type;\n    u8 probe;\n    u8 flags;\n    u8 _pad;\n    u32 pid;\n"
           "    u32 tid;\n    u32 _pad2;\n    u64 start_ns;\n    u64 end_ns;\n};"]
    for p, r in enumerate(resolved):
        out.append(f"struct up_rec_{p} {{\n    struct up_head h;\n{_slots(r.spec.args)}\n}};")
    return "\n".join(out) + "\n"


def _store(i: int, type_name: str, value: str) -> str:
    """e->a<i> = value converted to the declared scalar type (value: a C expression we built)."""
    if type_name == "bool":
        return f"    e->a{i} = ({value}) ? 1 : 0;"
    ctype, _size, signed = SCALAR_TYPES[type_name]
    return f"    e->a{i} = (u64)(s64)({ctype})({value});" if signed else f"    e->a{i} = (u64)({ctype})({value});"


def _reserve(p: int) -> str:
    return (f"    struct up_rec_{p} *e = events.ringbuf_reserve(sizeof(struct up_rec_{p}));\n"
            "    if (!e) {\n        oe_drop(OE_DROP_RINGBUF);\n        return 0;\n    }\n"
            "    __builtin_memset(e, 0, sizeof(*e));\n")


def _head(p: int, flags: int) -> str:
    return (f"    e->h.type = {UP_EV_HIT};\n    e->h.probe = {p};\n    e->h.flags = {flags};\n"
            "    e->h.pid = id >> 32;\n    e->h.tid = (u32)id;\n    e->h.start_ns = bpf_ktime_get_ns();\n"
            "    e->h.end_ns = e->h.start_ns;\n")


_PROLOGUE = ("    u64 id = bpf_get_current_pid_tgid();\n    if (!oe_is_traced(id >> 32))\n        return 0;\n")
_SUBMIT = "    events.ringbuf_submit(e, oe_wakeup_flags());\n    return 0;\n}\n"


def _reg_args(args: Sequence[ArgSpec], *, at_return: bool) -> str:
    out = []
    for i, a in enumerate(args):
        kind, _ = parse_type(a.type, "")
        if a.retval != at_return:
            continue
        src = "PT_REGS_RC(ctx)" if a.retval else f"{_PARM[int(a.index)]}(ctx)"
        if kind == "str":
            out.append(f"    bpf_probe_read_user_str(e->a{i}, sizeof(e->a{i}), (void *){src});")
        else:
            out.append(_store(i, a.type, src))
    return "\n".join(out) + "\n" if out else ""


def _uprobe(p: int, r: Resolved) -> str:
    args = r.spec.args
    if r.spec.kind == "uretprobe" or not r.spec.span:
        at_ret = r.spec.kind == "uretprobe"
        return (f"int up_{p}_{'return' if at_ret else 'entry'}(struct pt_regs *ctx)\n{{\n" + _PROLOGUE
                + _reserve(p) + _head(p, 0) + _reg_args(args, at_return=at_ret) + _SUBMIT)
    return (f"BPF_TABLE(\"lru_hash\", u32, struct up_rec_{p}, up_inflight_{p}, UP_MAX_INFLIGHT);\n"
            f"BPF_PERCPU_ARRAY(up_scratch_{p}, struct up_rec_{p}, 1);\n"
            f"int up_{p}_entry(struct pt_regs *ctx)\n{{\n" + _PROLOGUE
            + f"    int zero = 0;\n    struct up_rec_{p} *e = up_scratch_{p}.lookup(&zero);\n"
            "    if (!e)\n        return 0;\n    __builtin_memset(e, 0, sizeof(*e));\n"
            + _head(p, FLAG_SPAN) + _reg_args(args, at_return=False)
            + "    u32 tid = (u32)id;\n"
            f"    if (up_inflight_{p}.update(&tid, e) != 0)\n        oe_drop(OE_DROP_STATEMAP);\n    return 0;\n}}\n"
            f"int up_{p}_return(struct pt_regs *ctx)\n{{\n"
            "    u64 id = bpf_get_current_pid_tgid();\n    u32 tid = (u32)id;\n"
            f"    struct up_rec_{p} *st = up_inflight_{p}.lookup(&tid);\n    if (!st)\n        return 0;\n"
            f"    struct up_rec_{p} *e = events.ringbuf_reserve(sizeof(struct up_rec_{p}));\n"
            f"    if (!e) {{\n        oe_drop(OE_DROP_RINGBUF);\n        up_inflight_{p}.delete(&tid);\n"
            "        return 0;\n    }\n"
            "    bpf_probe_read_kernel(e, sizeof(*e), st);\n    e->h.end_ns = bpf_ktime_get_ns();\n"
            + _reg_args(args, at_return=True)
            + f"    up_inflight_{p}.delete(&tid);\n" + _SUBMIT)


def _usdt(p: int, r: Resolved) -> str:
    from otel_ebpf.bpf.usdt import arg_reader

    out = []
    for j, site in enumerate(r.sites):
        body = []
        for i, a in enumerate(r.spec.args):
            kind, _ = parse_type(a.type, "")
            body.append(f"    u64 t{i} = 0;\n    {arg_reader(site, int(a.index), f't{i}')}")
            if kind == "str":
                body.append(f"    bpf_probe_read_user_str(e->a{i}, sizeof(e->a{i}), (void *)t{i});")
            else:
                body.append(_store(i, a.type, f"t{i}"))
        out.append(f"int up_{p}_loc{j}(struct pt_regs *ctx)\n{{\n" + _PROLOGUE + _reserve(p) + _head(p, 0)
                   + "\n".join(body) + "\n" + _SUBMIT)
    return "".join(out)


def _tp_read(i: int, a: ArgSpec, f: TpField, user_strings: bool) -> str:
    kind, _ = parse_type(a.type, "")
    off = int(f.offset)
    if kind == "str":
        if f.is_char_array:
            return f"    bpf_probe_read_kernel_str(e->a{i}, sizeof(e->a{i}), (char *)ctx + {off});"
        fn = "bpf_probe_read_user_str" if user_strings else "bpf_probe_read_kernel_str"
        return f"    {fn}(e->a{i}, sizeof(e->a{i}), (void *)*(u64 *)((char *)ctx + {off}));"
    bits = int(f.size) * 8
    ctype = f"{'s' if f.signed else 'u'}{bits}"
    return _store(i, a.type, f"*({ctype} *)((char *)ctx + {off})")


def _tracepoint(p: int, r: Resolved) -> str:
    cat = r.spec.tracepoint.partition(":")[0]
    reads = [_tp_read(i, a, r.fields[a.field], cat == "syscalls") for i, a in enumerate(r.spec.args)]
    return (f"int up_{p}_tp(void *ctx)\n{{\n" + _PROLOGUE + _reserve(p) + _head(p, 0)
            + "\n".join(reads) + "\n" + _SUBMIT)


def generate(resolved: Sequence[Resolved]) -> str:
    """The receiver's program (appended to common.bpf.c). Raises ValueError if anything but
    the expected character set appears (a guard; validation already rejected bad input)."""
    parts = ["/* Generated by otel_ebpf/receivers/probes/codegen.py from validated probe entries. */",
             "#ifndef UP_MAX_INFLIGHT\n#define UP_MAX_INFLIGHT 8192\n#endif", header(resolved)]
    for p, r in enumerate(resolved):
        gen = {"uprobe": _uprobe, "uretprobe": _uprobe, "usdt": _usdt, "tracepoint": _tracepoint}[r.spec.kind]
        parts.append(gen(p, r))
    text = "\n".join(parts)
    if not _SAFE.fullmatch(text) or "#include" in text:
        raise ValueError("generated BPF program contains unexpected characters")
    return text
