"""The demo's job (otel_ebpf/demo/train.py) on the twin, untraced: real torch 2.11, FSDP2 + tensor parallel.

One 4-rank run (a straggler asleep before each step) checks the step lines and that each rank's
comms-rank<r>.json names the communicators NCCL made for it (the stand-in's trace of its ncclCommSplit calls);
one 2-rank run checks the kill: the killed rank stops after its step, the other ends in bounded time, non-zero.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from otel_ebpf.twin import TwinEnv, launch

TRAIN = Path(__file__).resolve().parents[2] / "otel_ebpf" / "demo" / "train.py"
STEP = re.compile(r"^oe-demo step rank=(\d+) step=(\d+)$", re.M)
# otel_ebpf/twin/nccl_comm.c with OTEL_EBPF_TWIN_TRACE=1: "[twin nccl PID] comm 0x.. hash H rank R/N" (init)
# and "[twin nccl PID] split rank R/N color C key K -> rank R'/N'" (ncclCommSplit)
INIT = re.compile(r"^\[twin nccl (\d+)\] comm \S+ hash \S+ rank (\d+)/4$", re.M)
SPLIT = re.compile(r"^\[twin nccl (\d+)\] split rank (\d+)/4 color (-?\d+) key -?\d+ -> rank (\d+)/(\d+)$", re.M)


def _nccl_groups(output: str) -> set[tuple[int, tuple[int, ...], int, int]]:
    """(global rank, members, its rank, size) of every split communicator, as the stand-in NCCL made them."""
    rank_of = {int(pid): int(rank) for pid, rank in INIT.findall(output)}
    calls: Counter[int] = Counter()
    splits = []  # every rank splits the world in the same order: the k-th calls are one split, its colors groups
    for pid, _, color, new, size in SPLIT.findall(output):
        calls[int(pid)] += 1
        splits.append((rank_of[int(pid)], (calls[int(pid)], int(color)), int(new), int(size)))
    members: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for g, group, new, _ in splits:
        members.setdefault(group, []).append((new, g))
    return {(g, tuple(m for _, m in sorted(members[group])), new, size) for g, group, new, size in splits}


def test_four_ranks_print_every_step_and_name_the_communicators_nccl_made(twin: TwinEnv, twin_cache: Path,
                                                                          tmp_path: Path) -> None:
    run = launch(TRAIN, nproc=4, args=["--steps", "3", "--straggler", "3", "--straggler-delay-ms", "20",
                                       "--straggler-cause", "sleep"],
                 env={"OTEL_EBPF_DEMO_DIR": str(tmp_path), "OTEL_EBPF_TWIN_TRACE": "1"}, timeout=240,
                 twin=twin, cache_dir=twin_cache)
    assert run.returncode == 0, run.output[-4000:]
    assert Counter(STEP.findall(run.output)) == {(str(r), str(k)): 1 for r in range(4) for k in (1, 2, 3)}
    comms = {r: json.loads((tmp_path / f"comms-rank{r}.json").read_text()) for r in range(4)}
    for r, groups in comms.items():  # one node of 4: tp = 2, dp = 2 (mesh (2, 2)), tp neighbours, dp strided
        by_name = {g["name"]: g for g in groups}
        assert by_name["world"] == {"name": "world", "members": [0, 1, 2, 3], "rank": r, "size": 4}
        assert by_name["tp"]["members"] == [r - r % 2, r - r % 2 + 1] and by_name["dp"]["members"] == [r % 2, r % 2 + 2]
    written = {(r, tuple(g["members"]), g["rank"], g["size"]) for r, gs in comms.items() for g in gs
               if g["name"] != "world"}
    assert written == _nccl_groups(run.output)  # dp and tp: each rank's two splits of the world


def test_a_killed_rank_ends_the_job_in_bounded_time_and_non_zero(twin: TwinEnv, twin_cache: Path,
                                                                 tmp_path: Path) -> None:
    run = launch(TRAIN, nproc=2, args=["--steps", "4", "--kill-rank", "1", "--kill-after-step", "1",
                                       "--timeout-s", "5"],
                 env={"OTEL_EBPF_DEMO_DIR": str(tmp_path)}, timeout=240, twin=twin, cache_dir=twin_cache)
    assert run.returncode != 0 and not run.timed_out, run.output[-4000:]
    steps = Counter(STEP.findall(run.output))
    assert steps[("1", "1")] == 1 and steps[("1", "2")] == 0  # it died after step 1
    assert steps[("0", "1")] == 1 and steps[("0", "4")] == 0
    # rank 0 waits in a collective for the dead rank until torchrun's SIGTERM (or its own step timeout) makes it
    # abort its communicators; it then exits 3
    assert re.search(r"rank 0: (the launcher stopped the job|step \d did not finish).*aborting", run.output)
    assert re.search(r"rank\s*: 0 \(local_rank: 0\)\s*\n\s*exitcode\s*: 3", run.output), run.output[-3000:]
