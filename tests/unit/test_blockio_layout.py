"""blockio.h against its Python side: histogram slots, op ids and drop-reason indexes (the maps
are read through BCC's own ctypes types, so these constants are the whole mirror)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_ebpf.receivers.blockio import receiver as blockio_receiver
from otel_ebpf.receivers.blockio.receiver import MISC_REASONS, OPS, SLOTS, device_name

HERE = Path(blockio_receiver.__file__).resolve().parent
SHIM = "typedef unsigned char u8; typedef unsigned int u32; typedef int s32; typedef unsigned long long u64;\n"
C_OPS = ("READ", "WRITE", "DISCARD", "FLUSH", "OTHER")
C_MISC = ("NO_ISSUE", "DEV_FULL", "PROC_FULL", "REQ_FULL", "FLUSH")


@pytest.fixture(scope="module")
def c_values(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if shutil.which("gcc") is None:
        if os.environ.get("CI"):
            pytest.fail("gcc is needed to check blockio.h against the receiver")
        pytest.skip("gcc not found")
    lines = ['printf("slots %d\\n", BLK_SLOTS);', 'printf("misc_slots %d\\n", BLK_MISC_SLOTS);',
             'printf("dev_val %zu\\n", sizeof(struct blk_dev_val));']
    lines += [f'printf("op {n} %d\\n", BLK_OP_{n});' for n in C_OPS]
    lines += [f'printf("misc {n} %d\\n", BLK_MISC_{n});' for n in C_MISC]
    src = (f'#include <stdio.h>\n{SHIM}#include "blockio.h"\nint main(void)\n{{\n' + "\n".join(lines)
           + "\nreturn 0;\n}\n")
    tmp = tmp_path_factory.mktemp("blockio_layout")
    (tmp / "l.c").write_text(src)
    subprocess.run(["gcc", "-Wall", "-Werror", f"-I{HERE}", "-o", str(tmp / "l"), str(tmp / "l.c")],
                   check=True, capture_output=True, timeout=60)
    out = subprocess.run([str(tmp / "l")], check=True, capture_output=True, text=True, timeout=10).stdout
    return {" ".join(line.split()[:-1]): int(line.split()[-1]) for line in out.splitlines()}


def test_histogram_slots_match(c_values: dict[str, int]) -> None:
    assert c_values["slots"] == SLOTS
    assert c_values["dev_val"] == 8 * (3 + SLOTS)


def test_op_ids_index_the_python_names(c_values: dict[str, int]) -> None:
    for name in C_OPS:
        assert OPS[c_values[f"op {name}"]] == name.lower()


def test_drop_reason_indexes_match(c_values: dict[str, int]) -> None:
    assert c_values["misc_slots"] == len(MISC_REASONS) + 1  # + the untimed-flush counter, last
    assert [c_values[f"misc {n}"] for n in C_MISC] == list(range(len(MISC_REASONS) + 1))


def test_every_bpf_map_named_in_python_exists_in_the_program() -> None:
    text = (HERE / "blockio.bpf.c").read_text()
    for table in ("blk_dev_stats", "blk_proc_stats", "blk_misc", "blk_reqs"):
        assert f"{table}," in text or f", {table}," in text, table


def test_device_names_come_from_sysfs_uevent(tmp_path: Path) -> None:
    d = tmp_path / "dev" / "block" / "259:3"
    d.mkdir(parents=True)
    (d / "uevent").write_text("MAJOR=259\nMINOR=3\nDEVNAME=nvme0n1p1\nDEVTYPE=partition\n")
    assert device_name(259 << 20 | 3, sys_root=str(tmp_path)) == "nvme0n1p1"
    assert device_name(8 << 20 | 17, sys_root=str(tmp_path)) == "8:17"  # unknown: MAJ:MIN
