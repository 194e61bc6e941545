"""Subgroups through torch's own API on 4 simulated GPUs: ncclCommSplit orders the child's ranks by key,
then parent rank, and non-members get no communicator, as NCCL 2.28.9 does (src/init.cc commGetSplitInfo);
the same with non-blocking communicators (TORCH_NCCL_USE_COMM_NONBLOCKING=1: config.blocking = 0, init
returns ncclInProgress, a split publishes *newcomm later from its own thread)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv, launch
from tests.twin.conftest import PROGRAMS


@pytest.mark.parametrize("nonblocking", [False, True], ids=["blocking", "nonblocking"])
def test_new_group_and_split_group_rank_order(twin: TwinEnv, twin_cache: Path, tmp_path: Path,
                                              nonblocking: bool) -> None:
    env = {"TORCH_NCCL_USE_COMM_NONBLOCKING": "1", "OTEL_EBPF_TWIN_TRACE": "1"} if nonblocking else None
    run = launch(PROGRAMS / "groups.py", 4, [str(tmp_path)], env=env, timeout=300, twin=twin, cache_dir=twin_cache)
    assert run.returncode == 0 and not run.timed_out, run.output[-4000:]
    if nonblocking:  # the world comm on each rank, then new_group's 2 members and split_group's 4
        assert run.output.count("(non-blocking)") == 4 + 2 + 4, run.output[-4000:]
    found = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)}
    # new_group([3, 1]): torch's group rank 0 is global rank 1; NCCL's child rank must agree, which the
    # all_gather's order and the broadcast's source show.
    for r, group_rank in ((1, 0), (3, 1)):
        assert found[r]["new_group"] == {"group_rank": group_rank, "group_size": 2, "all_gather": [1.0, 3.0],
                                         "all_reduce": 4.0, "broadcast_from_group_rank_0": 1.0}
    assert "new_group" not in found[0] and "new_group" not in found[2]  # NOCOLOR: not members
    # split_group([[2, 0], [3, 1]]): two colors in one split
    for r in range(4):
        members = [0.0, 2.0] if r % 2 == 0 else [1.0, 3.0]
        assert found[r]["split_group"] == {"group_rank": r // 2, "group_size": 2, "all_gather": members,
                                           "all_reduce": sum(members), "broadcast_from_group_rank_0": members[0]}
        assert found[r]["world_all_reduce"] == 4.0
