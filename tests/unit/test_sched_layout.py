"""sched.h as gcc lays it out == the Python mirrors in receivers/sched/receiver.py; decoding
through them; the receiver config as it reaches the program."""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from otel_ebpf.config import build
from otel_ebpf.errors import ConfigError
from otel_ebpf.pipeline import Context, ListConsumer
from otel_ebpf.receivers.sched import Config, factory
from otel_ebpf.receivers.sched import receiver as sched_receiver
from otel_ebpf.receivers.sched.events import SchedExec, SchedExitCode, SchedFork, SchedProcStats
from otel_ebpf.receivers.sched.receiver import EXEC, EXIT_CODE, FORK, MIRRORS, Mirror, SchedReceiver, _proc_delta

SCHED_DIR = Path(sched_receiver.__file__).resolve().parent
SHIM = ("typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32; typedef int s32; "
        "typedef unsigned long long u64;\n")


def _offsets(fmt: struct.Struct) -> list[tuple[int, int]]:
    out, pos = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt.format.lstrip("<")):
        n = int(count or 1)
        if code == "x":
            pos += n
            continue
        if code == "s":
            out.append((pos, n))
            pos += n
            continue
        size = struct.calcsize("<" + code)
        for _ in range(n):
            out.append((pos, size))
            pos += size
    return out


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if shutil.which("gcc") is None:
        if os.environ.get("CI"):
            pytest.fail("gcc is needed to check sched.h against its Python mirrors")
        pytest.skip("gcc not found")
    lines = []
    for m in MIRRORS:
        lines.append(f'printf("sizeof {m.c_struct} %zu\\n", sizeof(struct {m.c_struct}));')
        for f in m.fields:
            member = f"((struct {m.c_struct} *)0)->{f}"
            lines.append(f'printf("offsetof {m.c_struct} {f} %zu %zu\\n", '
                         f'__builtin_offsetof(struct {m.c_struct}, {f}), sizeof({member}));')
    for name in ("FORK", "EXEC", "EXIT_CODE"):
        lines.append(f'printf("etype {name} %d\\n", SCHED_EV_{name});')
    for name in ("HIST_SLOTS", "ARGS_LEN", "R_RUNQ"):
        lines.append(f'printf("const {name} %d\\n", SCHED_{name});')
    src = (f'#include <stdio.h>\n{SHIM}#include "sched.h"\nint main(void)\n{{\n    '
           + "\n    ".join(lines) + "\n    return 0;\n}\n")
    tmp = tmp_path_factory.mktemp("sched_layout")
    (tmp / "layout.c").write_text(src)
    subprocess.run(["gcc", "-Wall", "-Werror", f"-I{SCHED_DIR}", "-o", str(tmp / "layout"), str(tmp / "layout.c")],
                   check=True, capture_output=True, timeout=60)
    out = subprocess.run([str(tmp / "layout")], check=True, capture_output=True, text=True, timeout=10).stdout
    values: dict[str, int] = {}
    for line in out.splitlines():
        words = line.split()
        if words[0] == "offsetof":
            key = " ".join(words[:3])
            values[key], values[key + " size"] = int(words[3]), int(words[4])
        else:
            values[" ".join(words[:-1])] = int(words[-1])
    return values


@pytest.mark.parametrize("mirror", MIRRORS, ids=lambda m: m.c_struct)
def test_mirror_matches_c_layout(mirror: Mirror, c_layout: dict[str, int]) -> None:
    assert mirror.fmt.format.startswith("<")
    assert mirror.fmt.size == c_layout[f"sizeof {mirror.c_struct}"]
    offsets = _offsets(mirror.fmt)
    assert len(offsets) == len(mirror.fields)
    for (offset, size), field in zip(offsets, mirror.fields, strict=True):
        key = f"offsetof {mirror.c_struct} {field}"
        assert (offset, size) == (c_layout[key], c_layout[key + " size"]), field


@pytest.mark.parametrize("mirror", MIRRORS, ids=lambda m: m.c_struct)
def test_records_start_with_their_type_byte_in_the_sched_range(mirror: Mirror, c_layout: dict[str, int]) -> None:
    name = {"sched_fork_rec": "FORK", "sched_exec_rec": "EXEC", "sched_exit_code_rec": "EXIT_CODE"}[mirror.c_struct]
    assert mirror.fields[0] == "type" and _offsets(mirror.fmt)[0] == (0, 1)
    assert 48 <= mirror.etype == c_layout[f"etype {name}"] <= 63


def test_python_constants_match_sched_h(c_layout: dict[str, int]) -> None:
    assert c_layout["const HIST_SLOTS"] == sched_receiver._HIST_SLOTS
    assert c_layout["const ARGS_LEN"] == sched_receiver._ARGS_LEN
    assert c_layout["const R_RUNQ"] == sched_receiver._R_RUNQ


def _receiver(**cfg) -> SchedReceiver:
    return SchedReceiver(Config(**cfg), Context(), ListConsumer())


def test_decode_each_record() -> None:
    r = _receiver()
    r.clock.to_epoch_ns = lambda ts: ts + 1000  # type: ignore[method-assign]
    fork = FORK.fmt.pack(48, 10, 9, 5, b"sh")
    assert r.decode(48, fork) == SchedFork(10, 9, 1005, "sh")
    args = b"/bin/true\0a b\0"
    exe = EXEC.fmt.pack(49, 1, 2, 10, 11, len(args), 7, b"/bin/true", args)
    assert r.decode(49, exe) == SchedExec(10, 11, 1007, "/bin/true", ("/bin/true", "a b"), True)
    assert r.decode(50, EXIT_CODE.fmt.pack(50, 10, 3, 8)) == SchedExitCode(10, 1008, 3)
    with pytest.raises(ValueError):
        r.decode(51, bytes(64))


def test_proc_deltas() -> None:
    first = (100, 1, 2, 3, 4, 50, 6, 7) + (0,) * 12 + (5,) + (0,) * 27
    ev = _proc_delta(3, 9, None, first)
    assert ev == SchedProcStats(3, 9, 100, (1, 2, 3, 4), 50, 6, 7, ((12, 5),))
    second = (150, *first[1:])
    assert _proc_delta(3, 10, first, second) == SchedProcStats(3, 10, 50, (0, 0, 0, 0), 0, 0, 0, ())
    assert _proc_delta(3, 11, second, second) is None


def test_config_reaches_the_program() -> None:
    flags = _receiver(max_threads=7, max_processes=8, max_cpu_keys=9, lock_reason=False).program_cflags()
    for flag in ("-DSCHED_MAX_THREADS=7", "-DSCHED_MAX_PROCS=8", "-DSCHED_MAX_CPU_KEYS=9", "-DSCHED_LOCK=0"):
        assert flag in flags
    assert any(f.startswith("-DSCHED_NEWTASK_FLAGS_OFF=") for f in flags)


@pytest.mark.parametrize("key,value", [("ringbuf_pages", 3), ("max_threads", 0), ("max_processes", 0),
                                       ("max_cpu_keys", 0), ("stats_interval", 0.001), ("sample_interval", 0)])
def test_bad_config_names_its_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"receivers.sched.{key}"):
        build(Config, {key: value}, "receivers.sched")


def test_factory() -> None:
    assert factory.type == "sched" and factory.config_class is Config


def test_shutdown_without_start_and_twice_is_safe() -> None:
    r = _receiver()
    r.shutdown()
    r.shutdown()
    assert r.bpf is None and r.read_stats() == []
