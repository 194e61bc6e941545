"""Real PyTorch's subgroups, traced: under ``otel-ebpf run`` on the twin (4 ranks), every collective span of
every communicator torch makes (world, ``new_group`` with non-members, ``split_group``, both dimensions of a
2x2 DeviceMesh; the subgroups all made by ncclCommSplit, torch never calling ncclCommUserRank/ncclCommCount)
carries ``nccl.rank`` and ``nccl.nranks`` equal to torch's own ``dist.get_rank(group)`` and
``get_world_size(group)``, and nothing is counted as ``otel_ebpf.nccl.unjoined{reason=no_rank}``."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv
from otel_ebpf.twin.launch import twin_environment
from tests.faults.agentproc import counter_total
from tests.support.otlp_sink import decode_attrs, metrics_from_jsonl, spans_from_jsonl
from tests.twin.conftest import PROGRAMS

COLLECTIVES = ("ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
               "ncclAllToAll")
Group = dict[int, tuple[int, int]]  # global rank -> (rank in the group, group size)


def traced_run(twin: TwinEnv, libdir: Path, script: Path, nproc: int, out: Path,
               agent_out: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``otel-ebpf run`` around torchrun on the twin's libraries (the environment otel_ebpf.twin.launch gives)."""
    rendezvous = Path(tempfile.mkdtemp(prefix="otel-ebpf-twin-"))
    try:
        cmd = [sys.executable, "-m", "otel_ebpf", "run", "--output", str(agent_out), "--",
               str(twin.python), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(script), str(out)]
        env = {**twin_environment(libdir, nproc, rendezvous), **(extra_env or {})}
        return subprocess.run(cmd, env=env, capture_output=True,
                              text=True, timeout=400)
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)


def torch_groups(out: Path, nproc: int) -> tuple[dict[int, int], list[Group]]:
    """(pid -> global rank, each group torch used as global rank -> (its rank, its size)) from the ranks' files."""
    views = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    groups: dict[tuple[str, tuple[int, ...]], Group] = {}
    for v in views:
        for g in v["groups"]:
            groups.setdefault((g["name"], tuple(g["members"])), {})[v["rank"]] = (g["rank"], g["size"])
    return {v["pid"]: v["rank"] for v in views}, list(groups.values())


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
    rank_of_pid, expected = torch_groups(tmp_path, 4)
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
