"""The Python mirrors in otel_ebpf/receivers/nccl/receiver.py match nccl.h as gcc lays it out."""
from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from otel_ebpf.receivers.nccl import receiver as rx

from tests.support.layout import CLayout, assert_members, measure

HEADER = Path(rx.__file__).with_name("nccl.h")


def _defines() -> list[str]:
    return re.findall(r"^#define\s+(NCCL_\w+)\s+\d+", HEADER.read_text(), re.M)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> CLayout:
    return measure(HEADER.parent, HEADER.name, tmp_path_factory.mktemp("nccl_layout"),
                   structs={lay.c_name: [name for name, _ in lay.fields] for lay in rx.LAYOUTS}, values=_defines())


@pytest.mark.parametrize("layout", rx.LAYOUTS, ids=lambda lay: lay.c_name)
def test_python_mirror_has_the_c_size_and_offsets(layout: rx.Layout, measured: CLayout) -> None:
    assert_members(measured, layout.c_name, layout.struct.size,
                   [(name, layout.offsets[name], struct.calcsize("<" + code)) for name, code in layout.fields])


@pytest.mark.parametrize("layout", rx.LAYOUTS, ids=lambda lay: lay.c_name)
def test_python_mirror_names_every_c_field_in_order(layout: rx.Layout) -> None:
    body = re.search(rf"struct {layout.c_name} \{{(.*?)\}};", HEADER.read_text(), re.S)
    assert body is not None
    text = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    c_fields = re.findall(r"\b(\w+)\s*(?:\[[^\]]*\])?\s*;", text)
    assert c_fields == [name for name, _ in layout.fields]


def test_record_types_are_distinct_start_at_32_and_match_the_header(measured: CLayout) -> None:
    types = [lay.etype for lay in rx.LAYOUTS]
    assert len(set(types)) == len(types) and min(types) >= 32
    for lay in rx.LAYOUTS:
        assert lay.fields[0] == ("type", "B")
    by_value = {v: k for k, v in measured.values.items() if k.startswith("NCCL_EV_")}
    assert sorted(by_value) == sorted(types)


def test_op_and_kind_tables_follow_the_header_defines(measured: CLayout) -> None:
    defines = measured.values
    ops = sorted((v, k) for k, v in defines.items() if k.startswith("NCCL_OP_"))
    assert [v for v, _ in ops] == list(range(len(rx.OPS)))
    assert [k.removeprefix("NCCL_OP_").replace("_", "").lower() for _, k in ops] == \
        [op.lower() for op in rx.OPS]
    inits = sorted((v, k) for k, v in defines.items() if k.startswith("NCCL_INIT_") and k != "NCCL_INIT_ALL_MAX")
    assert [k for _, k in inits] == ["NCCL_INIT_RANK", "NCCL_INIT_RANK_CONFIG", "NCCL_INIT_RANK_SCALABLE"]
    assert len(rx.INIT_FUNCTIONS) == len(inits)
    infos = sorted((v, k) for k, v in defines.items() if k.startswith("NCCL_INFO_"))
    assert [k for _, k in infos] == ["NCCL_INFO_COUNT", "NCCL_INFO_USER_RANK", "NCCL_INFO_CU_DEVICE"]
    assert rx.INFO_KINDS == ("nranks", "rank", "device")
    assert defines["NCCL_F_SEQ"] == rx.F_SEQ
    assert defines["NCCL_END_ABORT"] == 1
    assert rx.COMM_INIT.struct.size - rx.COMM_INIT.offsets["id"] == defines["NCCL_UNIQUE_ID_BYTES"]
    assert rx.COMM_INIT_ALL.fields[-1] == ("devs", f"{defines['NCCL_INIT_ALL_MAX']}i")
