"""User-declared probe entries: every bad entry is a ConfigError naming its key path before
anything is generated; the generated C depends on nothing but validated structure (names,
symbols and paths never reach it), checked by example and by hypothesis; the record structs
as gcc lays them out match the Python decoding; records decode with sign and truncation."""
from __future__ import annotations

import dataclasses
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.receivers.probes import Config, factory
from otel_ebpf.receivers.probes.codegen import HEAD, HEAD_FIELDS, UP_EV_HIT, generate, header, layout
from otel_ebpf.receivers.probes.config import IDENT, SCALAR_TYPES, SYMBOL, ProbeSpec
from otel_ebpf.receivers.probes.events import ProbeHit
from otel_ebpf.receivers.probes.targets import Resolved, TpField

PATH = "receivers.probes"
SHIM = ("typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32; "
        "typedef unsigned long long u64;\n")


def _build(probes: list[dict[str, Any]]) -> Config:
    return build(Config, {"probes": probes, "check_targets": False}, PATH)


def _uprobe(**kw: Any) -> dict[str, Any]:
    return {"name": "process_batch", "kind": "uprobe", "library": "/lib/x.so", "symbol": "process_batch", **kw}


@pytest.mark.parametrize(("entry", "key", "message"), [
    (_uprobe(name='x; system("rm -rf /")'), "probes[0].name", "must be an identifier"),
    (_uprobe(args=[{"name": "a\n#include <x>", "type": "u32", "index": 0}]), "probes[0].args[0].name",
     "must be an identifier"),
    (_uprobe(symbol='f"); bpf_override_return(ctx, 0); ("'), "probes[0].symbol", "not a valid ELF symbol name"),
    (_uprobe(args=[{"name": "v", "type": "double", "index": 0}]), "probes[0].args[0].type",
     "BPF has no floating point"),
    (_uprobe(args=[{"name": "v", "type": "char *", "index": 0}]), "probes[0].args[0].type", "unknown type"),
    (_uprobe(args=[{"name": "v", "type": "str[300]", "index": 0}]), "probes[0].args[0].type", "N <= 256"),
    (_uprobe(args=[{"name": "v", "type": "u64", "index": 6}]), "probes[0].args[0].index",
     "stack arguments are not supported"),
    (_uprobe(args=[{"name": "v", "type": "u64"}]), "probes[0].args[0]", "exactly one of index, field or retval"),
    (_uprobe(args=[{"name": "v", "type": "u64", "retval": True}]), "probes[0].args[0].retval",
     "only for a uretprobe or a uprobe with span: true"),
    (_uprobe(kind="uretprobe", args=[{"name": "v", "type": "u64", "index": 0}]), "probes[0].args[0].index",
     "a uretprobe sees only the return value"),
    (_uprobe(args=[{"name": "v", "type": "u8", "index": 0}, {"name": "v", "type": "u8", "index": 1}]),
     "probes[0].args[1].name", "duplicate argument name 'v'"),
    (_uprobe(args=[{"name": f"s{i}", "type": "str[256]", "index": i} for i in range(3)]), "probes[0].args",
     "768 bytes, at most 512"),
    (_uprobe(symbol=""), "probes[0].symbol", "required for kind uprobe"),
    (_uprobe(tracepoint="syscalls:sys_enter_openat"), "probes[0].tracepoint", "not used by kind uprobe"),
    (_uprobe(metric="histogram"), "probes[0].metric", "histogram of what?"),
    (_uprobe(metric="none"), "probes[0].metric", "produces nothing"),
    (_uprobe(metric="histogram", value="nope"), "probes[0].value", "no argument named 'nope'"),
    ({"name": "u", "kind": "usdt", "library": "/bin/x", "provider": "p", "probe": "q", "span": True},
     "probes[0].span", "single point"),
    ({"name": "u", "kind": "usdt", "library": "/bin/x", "provider": "p-x", "probe": "q"}, "probes[0].provider",
     "must be an identifier"),
    ({"name": "t", "kind": "tracepoint", "tracepoint": "syscalls:sys_enter_openat/../../x"},
     "probes[0].tracepoint", "must be 'category:name'"),
    ({"name": "t", "kind": "tracepoint", "tracepoint": "a:b", "args": [{"name": "x", "type": "u8", "index": 0}]},
     "probes[0].args[0]", "named by 'field'"),
    ({"name": "t", "kind": "tracepoint", "tracepoint": "a:b",
      "args": [{"name": "x", "type": "u8", "field": "f->g"}]}, "probes[0].args[0].field", "must be an identifier"),
    ({"name": "t", "kind": "kprobe"}, "probes[0].kind", "must be one of"),
])
def test_bad_entry_names_its_key(entry: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _build([entry])
    assert err.value.path == f"{PATH}.{key}"
    assert message in str(err.value)


def test_duplicate_probe_names_and_bounds() -> None:
    with pytest.raises(ConfigError, match="duplicate probe name") as err:
        _build([_uprobe(), _uprobe()])
    assert err.value.path == f"{PATH}.probes[1].name"
    with pytest.raises(ConfigError) as err:
        build(Config, {"ringbuf_pages": 3}, PATH)
    assert err.value.path == f"{PATH}.ringbuf_pages"


def _fake_resolved(spec: ProbeSpec) -> Resolved:
    """What targets.resolve would return, without the host: tracepoint fields made up, one per
    distinct field name in order of first use (its type from that first use)."""
    if spec.kind == "tracepoint":
        fields: dict[str, TpField] = {}
        for a in spec.args:
            if a.field not in fields:
                decl = "const char * x" if a.type.startswith("str") else "long x"
                fields[a.field] = TpField(a.field, decl, 16 + 8 * len(fields), 8, True)
        return Resolved(spec, fields=fields)
    return Resolved(spec, path=spec.library)


def _neutral(spec: ProbeSpec) -> ProbeSpec:
    """The same entry with every user-chosen string replaced by a constant."""
    fields = {f: f"f{k}" for k, f in enumerate(dict.fromkeys(a.field for a in spec.args if a.field))}
    args = [dataclasses.replace(a, name=f"n{i}", field=fields.get(a.field, "")) for i, a in enumerate(spec.args)]
    value = f"n{[a.name for a in spec.args].index(spec.value)}" if spec.value else ""
    return dataclasses.replace(spec, name="p", library="/l" if spec.library else "", symbol="s" if spec.symbol else "",
                               provider="v" if spec.provider else "", probe="w" if spec.probe else "",
                               tracepoint="c:t" if spec.tracepoint else "", args=args, value=value)


def test_generated_c_carries_no_user_strings() -> None:
    cfg = _build([
        _uprobe(name="evil_name", symbol="evil_symbol", span=True, args=[
            {"name": "evil_arg", "type": "s32", "index": 0}, {"name": "m", "type": "str[64]", "index": 1},
            {"name": "rc", "type": "s64", "retval": True}]),
        {"name": "tp_evil", "kind": "tracepoint", "tracepoint": "evilcat:evilname",
         "args": [{"name": "d", "type": "s32", "field": "evil_field"}, {"name": "f", "type": "str[32]",
                                                                         "field": "evil_file"}]},
    ])
    text = generate([_fake_resolved(p) for p in cfg.probes])
    assert "evil" not in text and "/lib/x.so" not in text
    assert text == generate([_fake_resolved(_neutral(p)) for p in cfg.probes])
    assert "PT_REGS_PARM1(ctx)" in text and "PT_REGS_RC(ctx)" in text and "(char *)ctx + 24" in text


_JUNK = st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ['x; system("rm -rf /")', "a\n#include <linux/sched.h>", 'sym"bol', "*/ int x; /*", "a:b:c", "", "1abc",
     "str[0]", "str[257]", "double", "char *", "u32 ", "../../etc", "a" * 65])
_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
_SCALARS = sorted(SCALAR_TYPES)
_VALID_STR = r"str\[([1-9][0-9]?|1[0-9][0-9]|2[0-4][0-9]|25[0-6])\]"


@st.composite
def _valid_entry(draw: st.DrawFn) -> dict[str, Any]:
    """A structurally valid uprobe, uretprobe or tracepoint entry with arbitrary identifiers."""
    kind = draw(st.sampled_from(["uprobe", "uretprobe", "tracepoint"]))
    span = kind == "uprobe" and draw(st.booleans())
    names = draw(st.lists(_IDENT, min_size=0, max_size=4, unique=True))
    args = []
    for n in names:
        if kind == "tracepoint":
            typ = draw(st.sampled_from([*_SCALARS, "str[16]"]))
            args.append({"name": n, "type": typ, "field": draw(_IDENT)})
        elif kind == "uretprobe" or (span and draw(st.booleans())):
            args.append({"name": n, "type": draw(st.sampled_from(_SCALARS)), "retval": True})
        else:
            typ = draw(st.sampled_from([*_SCALARS, "str[1]", "str[64]"]))
            args.append({"name": n, "type": typ, "index": draw(st.integers(0, 5))})
    entry: dict[str, Any] = {"name": draw(_IDENT), "kind": kind, "span": span, "args": args}
    if kind == "tracepoint":
        entry["tracepoint"] = f"{draw(_IDENT)}:{draw(_IDENT)}"
    else:
        entry.update(library="/usr/lib/x.so", symbol=draw(_IDENT))
    return entry


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entry=_valid_entry())
def test_fuzz_valid_entries_generate_c_independent_of_their_strings(entry: dict[str, Any]) -> None:
    (spec,) = _build([entry]).probes
    text = generate([_fake_resolved(spec)])
    assert text == generate([_fake_resolved(_neutral(spec))])  # no entry string reached the C text
    assert "#include" not in text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entry=_valid_entry(), junk=_JUNK, where=st.sampled_from(["name", "symbol", "tracepoint", "arg.name",
                                                                 "arg.type", "arg.field"]))
def test_fuzz_junk_in_any_string_is_rejected_before_codegen(entry: dict[str, Any], junk: str, where: str) -> None:
    if where.startswith("arg."):
        if not entry["args"]:
            return
        key = where[4:]
        if key == "field" and entry["kind"] != "tracepoint":
            return
        if key == "type" and (junk in SCALAR_TYPES or re.fullmatch(_VALID_STR, junk)):
            return
        entry["args"][0][key] = junk
    else:
        if where not in entry or (where == "symbol" and SYMBOL.fullmatch(junk)):
            return
        entry[where] = junk
    if IDENT.fullmatch(junk) and where != "arg.type":
        return  # junk that happens to be an identifier is valid
    with pytest.raises(ConfigError):
        _build([entry])


def test_record_layout_matches_gcc(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed (scripts/setup.sh installs it)")
    cfg = _build([_uprobe(span=True, args=[
        {"name": "a", "type": "u8", "index": 0}, {"name": "s", "type": "str[13]", "index": 1},
        {"name": "b", "type": "s64", "index": 2}, {"name": "t", "type": "str[256]", "index": 3},
        {"name": "r", "type": "bool", "retval": True}])])
    src = tmp_path / "layout.c"
    members = [f"h.{f}" for f in HEAD_FIELDS] + [f"a{i}" for i in range(5)]
    prints = "\n".join(f'printf("%zu %zu\\n", offsetof(struct up_rec_0, {m}), sizeof(((struct up_rec_0 *)0)->{m}));'
                       for m in members)
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n" + SHIM + header([_fake_resolved(cfg.probes[0])])
                   + f'int main(void) {{\n{prints}\nprintf("%zu\\n", sizeof(struct up_rec_0));\nreturn 0;\n}}\n')
    exe = tmp_path / "layout"
    subprocess.run(["gcc", "-o", str(exe), str(src)], check=True, capture_output=True, timeout=60)
    lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=10).stdout.split("\n")
    got = [tuple(map(int, ln.split())) for ln in lines[:-2]]
    lay = layout(cfg.probes[0].args)
    want = [(0, 1), (1, 1), (2, 1), (4, 4), (8, 4), (16, 8), (24, 8)]
    pos = HEAD.size
    for code in ("Q", "16s", "Q", "256s", "Q"):
        size = struct.calcsize("<" + code)
        want.append((pos, size))
        pos += size
    assert got == want
    assert int(lines[-2]) == HEAD.size + lay.fmt.size == pos


def test_decode_signs_truncation_and_pointer() -> None:
    cfg = _build([_uprobe(span=True, metric="histogram", args=[
        {"name": "n", "type": "s32", "index": 0}, {"name": "m", "type": "str[8]", "index": 1},
        {"name": "p", "type": "pointer", "index": 2}, {"name": "ok", "type": "bool", "index": 3},
        {"name": "u", "type": "u16", "index": 4}])])
    rx = factory.create(cfg, Context(), ListConsumer())
    data = layout(cfg.probes[0].args).fmt.pack((1 << 64) - 3, b"resnet\0\0", 0x7F00DEAD0000, 1, 0x12345)
    raw = HEAD.pack(UP_EV_HIT, 0, 1, 42, 43, 1000, 5000) + data
    ev = rx.decode(UP_EV_HIT, raw)
    assert isinstance(ev, ProbeHit)
    assert (ev.pid, ev.tid, ev.probe, ev.span, ev.metric) == (42, 43, "process_batch", True, "histogram")
    assert dict(ev.args) == {"n": -3, "m": "resnet", "p": "0x7f00dead0000", "ok": True, "u": 0x2345}
    assert ev.end_ns - ev.start_ns == 4000
    with pytest.raises(ValueError, match="unknown user probe record type"):
        rx.decode(UP_EV_HIT + 1, raw)
    rx.shutdown()
    rx.shutdown()


def test_registered_off_by_default_and_empty_is_noop() -> None:
    from otel_ebpf.service import components
    assert not components.receivers()["probes"].default_on
    assert not components.processors()["probes"].default_on
    rx = factory.create(Config(), Context(), ListConsumer())
    rx.start()  # no entries: nothing compiled, no root needed
    assert rx.bpf is None
    rx.shutdown()


def test_usdt_operands_become_c_from_integers_and_whitelisted_registers() -> None:
    from otel_ebpf.bpf.usdt import REGISTERS, ArgLoc, Site, arg_reader

    site = Site("/x", 0, 0, (ArgLoc(4, True, register="ax"), ArgLoc(8, False, register="sp", deref_offset=16),
                             ArgLoc(2, True, constant=-5), ArgLoc(1, True, register="r12", deref_offset=-3)))
    assert arg_reader(site, 0, "t0") == "t0 = (u64)(s32)(u32)(ctx->ax);"
    assert arg_reader(site, 1, "t1") == ("{ u64 t1_m = 0; bpf_probe_read_user(&t1_m, sizeof(t1_m), "
                                         "(void *)(ctx->sp + (16))); t1 = (u64)t1_m; }")
    assert arg_reader(site, 2, "t2") == "t2 = (u64)(-5LL);"
    assert "(u64)(s8)t3_m" in arg_reader(site, 3, "t3") and "ctx->r12 + (-3)" in arg_reader(site, 3, "t3")
    assert REGISTERS["rdi"] == REGISTERS["edi"] == REGISTERS["di"] == "di" and REGISTERS["r9d"] == "r9"
    assert all(re.fullmatch(r"[a-z0-9]+", v) for v in REGISTERS.values())
