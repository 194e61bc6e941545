"""blockio.h against its Python side: histogram slots, op ids and drop-reason indexes (the maps
are read through BCC's own ctypes types, so these constants are the whole mirror)."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.receivers.blockio import receiver as blockio_receiver
from otel_ebpf.receivers.blockio.receiver import MISC_REASONS, OPS, SLOTS, device_name

from tests.support.layout import measure

HERE = Path(blockio_receiver.__file__).resolve().parent
C_OPS = ("READ", "WRITE", "DISCARD", "FLUSH", "OTHER")
C_MISC = ("NO_ISSUE", "DEV_FULL", "PROC_FULL", "REQ_FULL", "FLUSH")


@pytest.fixture(scope="module")
def c_values(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    exprs = {"slots": "BLK_SLOTS", "misc_slots": "BLK_MISC_SLOTS", "dev_val": "sizeof(struct blk_dev_val)"}
    exprs |= {f"op {n}": f"BLK_OP_{n}" for n in C_OPS} | {f"misc {n}": f"BLK_MISC_{n}" for n in C_MISC}
    return measure(HERE, "blockio.h", tmp_path_factory.mktemp("blockio_layout"), values=exprs).values


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
