"""Real PyTorch's subgroups, traced: under ``otel-ebpf run`` on the twin (4 ranks), every collective span of
every communicator torch makes (world, ``new_group`` with non-members, ``split_group``, both dimensions of a
2x2 DeviceMesh; the subgroups all made by ncclCommSplit, torch never calling ncclCommUserRank/ncclCommCount)
carries ``nccl.rank`` and ``nccl.nranks`` equal to torch's own ``dist.get_rank(group)`` and
``get_world_size(group)``, and nothing is counted as ``otel_ebpf.nccl.unjoined{reason=no_rank}``."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv
from tests.faults.agentproc import counter_total
from tests.support.otlp_sink import decode_attrs, metrics_from_jsonl, spans_from_jsonl
from tests.twin.conftest import PROGRAMS
from tests.twin.support import Group, rank_records, torch_groups, traced_run

COLLECTIVES = ("ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
               "ncclAllToAll")


@pytest.mark.parametrize("nonblocking", [False, True], ids=["blocking", "nonblocking"])
def test_every_collective_of_every_split_communicator_has_torchs_rank_and_size(
        twin: TwinEnv, libdir: Path, tmp_path: Path, nonblocking: bool) -> None:
    """Non-blocking (TORCH_NCCL_USE_COMM_NONBLOCKING=1): the world's init returns ncclInProgress with its
    handle; each split returns ncclSuccess before its child exists (``*newcomm`` NULL, NCCL 2.28.9
    ncclCommInitChildComm); the child is learned from its first call."""
    agent_out = tmp_path / "agent"
    run = traced_run(twin, libdir, PROGRAMS / "traced_groups.py", 4, tmp_path, agent_out,
                     {"TORCH_NCCL_USE_COMM_NONBLOCKING": "1"} if nonblocking else None)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    views = rank_records(tmp_path, 4)
    rank_of_pid, expected = {v["pid"]: v["rank"] for v in views}, torch_groups(views)
    calls = [(res, decode_attrs(s.attributes)) for res, _scope, s in spans_from_jsonl(agent_out / "traces.jsonl")
             if s.name in COLLECTIVES]
    assert calls
    unranked = [a for _res, a in calls if "nccl.rank" not in a or "nccl.nranks" not in a]
    assert not unranked, f"{len(unranked)} of {len(calls)} collective spans lack nccl.rank/nccl.nranks"
    found: dict[str, Group] = {}
    for res, attrs in calls:
        found.setdefault(attrs["nccl.comm.id"], {})[rank_of_pid[res["process.pid"]]] = (
            attrs["nccl.rank"], attrs["nccl.nranks"])
    def key(group: Group) -> list[tuple[int, tuple[int, int]]]:
        return sorted(group.items())

    assert sorted(map(key, found.values())) == sorted(map(key, expected))  # one communicator per torch group
    metrics = metrics_from_jsonl(agent_out / "metrics.jsonl")
    assert counter_total(metrics, "otel_ebpf.nccl.unjoined", reason="no_rank") == 0
    assert counter_total(metrics, "otel_ebpf.nccl.unjoined", reason="split_unresolved") == 0
