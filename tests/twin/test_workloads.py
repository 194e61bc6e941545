"""Real PyTorch workloads on the twin, traced, asserted at the GATEWAY's output (issue 14 item 4).

Three jobs on 2 namespace nodes x 2 ranks (otel_ebpf.twin.cluster: an agent per node, one gateway;
tests/twin/programs/wl_*.py; each workload a phase of one job, to keep CI short):
``mix`` = DDP, ``new_group`` subsets with non-members, MoE uneven ``all_to_all_single``, 4-stage pipelining;
``sharded`` = FSDP2, HSDP on a (replicate, shard) mesh, DTensor tensor parallel; ``nonblocking`` = ``sharded``
with ``TORCH_NCCL_USE_COMM_NONBLOCKING=1``. One rank sleeps before every step (the injected straggler).

For each job, at the gateway: every collective instance is one trace holding exactly the ranks of one group
torch made, each with torch's own ``get_rank``/``get_world_size`` of that group (the ranks write them out);
every torch group that was used is seen; every span's parent is in its trace; each grouped send/recv (MoE
all-to-all, a pipeline batch, TP's scatter) is one trace under one joined ``nccl GroupP2P`` root, every
send matched by its recv, its ranks the ones that workload exchanges between; each step's marker all-reduce
names the sleeping rank as its straggler; no span is counted as unjoined. The joined/total numbers per
workload are printed (``pytest -s``; docs/benchmarks.md "Twin workloads").
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv
from otel_ebpf.twin.cluster import ClusterSpec, run_cluster
from tests.twin.conftest import PROGRAMS
from tests.twin.support import (
    GatewayView,
    counters,
    gateway_view,
    gpu_problems,
    joined_numbers,
    membership_problems,
    p2p_problems,
    rank_records,
    straggler_problems,
)

MARKER = 7  # wl_common.MARKER: elements of each step's marker all-reduce
STEPS = 2
DELAY_S = 0.4  # the straggler's sleep before each step: far above the ranks' usual skew (ms)


@dataclass(frozen=True)
class Job:
    """One traced job: program, its phases, the straggler rank, extra environment, and the checks a known
    gap elsewhere (agent, gateway, stand-in) makes fail today: check name -> the gap (strict xfail, so the
    fix is noticed)."""

    script: str
    phases: tuple[str, ...]
    straggler: int
    env: Mapping[str, str] = field(default_factory=dict)
    gaps: Mapping[str, str] = field(default_factory=dict)


# The global ranks of each grouped send/recv instance, per phase: MoE's all-to-all spans the world, a pipeline
# stage's batch links neighbouring stages (and the stages' start-up exchange with both neighbours, torch
# pipelining stage.py _get_init_p2p_neighbors_ops, the whole chain), TP's scatter of the sharded weights
# (distribute_tensor) a tp group.
P2P_RANKS: dict[str, list[set[int]]] = {"moe": [{0, 1, 2, 3}], "pp": [{0, 1}, {1, 2}, {2, 3}, {0, 1, 2, 3}],
                                        "tp": [{0, 1}, {2, 3}]}

JOBS = {
    "mix": Job("wl_mix.py", ("ddp", "new_group", "moe", "pp"), 3),
    "sharded": Job("wl_sharded.py", ("fsdp2", "hsdp", "tp"), 2),
    "nonblocking": Job("wl_sharded.py", ("fsdp2", "hsdp", "tp"), 1, {"TORCH_NCCL_USE_COMM_NONBLOCKING": "1"}),
}


@dataclass(frozen=True)
class Traced:
    job: Job
    view: GatewayView
    metrics: Path
    output: str  # the job's and the agent's output, the gateway's at the end

    def expect(self, request: pytest.FixtureRequest, check: str) -> None:
        """Marks the running test as a strict xfail when ``check`` has a known gap in this job."""
        if check in self.job.gaps:
            request.applymarker(pytest.mark.xfail(reason=self.job.gaps[check], strict=True))


pytestmark = [pytest.mark.bpf, pytest.mark.timeout(400)]


@pytest.fixture(scope="module", params=sorted(JOBS))
def traced(request: pytest.FixtureRequest, bpf_ready: None, twin: TwinEnv,
           tmp_path_factory: pytest.TempPathFactory) -> Traced:
    """Runs the job once for the module's tests (2 steps per phase, the straggler sleeping before each)."""
    job = JOBS[request.param]
    out = tmp_path_factory.mktemp(f"wl-{request.param}")
    args = [str(out), "--steps", str(STEPS), "--phases", ",".join(job.phases), "--straggler",
            str(job.straggler), "--delay", str(DELAY_S)]
    lines: list[str] = []
    run = run_cluster(ClusterSpec(PROGRAMS / job.script, args, output=out / "gateway", env=job.env, timeout=300),
                      on_line=lambda i, line: lines.append(f"[node-{i}] {line}"))
    output = "\n".join(lines)[-6000:]
    assert run.returncodes == {0: 0, 1: 0} and not run.timed_out and not run.problems, (run.problems, output)
    print(f"twin job {request.param}: {run.seconds:.1f} s")
    view = gateway_view(run.traces, rank_records(out, 4))
    return Traced(job, view, run.metrics, output)


def test_every_collective_is_one_trace_of_exactly_its_groups_ranks(traced: Traced,
                                                                   request: pytest.FixtureRequest) -> None:
    traced.expect(request, "membership")
    problems = membership_problems(traced.view)
    assert not problems, "\n".join(problems[:20]) + "\n" + traced.output[-3000:]


def test_every_grouped_send_recv_is_one_joined_instance(traced: Traced, request: pytest.FixtureRequest) -> None:
    traced.expect(request, "p2p")
    problems = p2p_problems(traced.view, P2P_RANKS)
    assert not problems, "\n".join(problems[:20])


def test_the_sleeping_rank_is_named_straggler_of_each_step(traced: Traced) -> None:
    job = traced.job
    problems = straggler_problems(traced.view, job.straggler, MARKER, STEPS * len(job.phases))
    assert not problems, "\n".join(problems)


def test_nothing_is_unjoined(traced: Traced, request: pytest.FixtureRequest) -> None:
    """The agents' ``otel_ebpf.nccl.unjoined`` and the gateway's ``otel_ebpf.collective_join.unjoined``, all
    reasons but ``rank_at_gateway`` (an agent that saw only some of a parent's ranks leaves a split child's
    rank to the gateway: ranked there, else counted as ``split_unresolved``)."""
    traced.expect(request, "unjoined")
    agents = {k: v for k, v in counters(traced.metrics, "otel_ebpf.nccl.unjoined").items()
              if k != "rank_at_gateway"}
    assert agents == {}
    assert counters(traced.metrics, "otel_ebpf.collective_join.unjoined") == {}


def test_every_collective_has_each_ranks_gpu_time_and_a_joined_gpu_span(traced: Traced) -> None:
    """The NCCL profiler plugin (loaded by `otel-ebpf run`, called by the twin's NCCL as NCCL 2.28.9 calls it):
    every complete collective has every rank's GPU span with NCCL's algorithm, protocol and duration, and one
    joined GPU span at the gateway (issue 16)."""
    problems = gpu_problems(traced.view)
    assert not problems, "\n".join(problems[:20])
    n = sum(1 for spans in traced.view.gpu.values() for name, _r, _a in spans if name.startswith("nccl "))
    print(f"twin job: {n} joined GPU spans, {sum(map(len, traced.view.gpu.values())) - n} rank GPU spans")


def test_joined_per_workload(traced: Traced) -> None:
    """Prints the numbers (joined / total per phase) and checks every phase ran collectives."""
    numbers = joined_numbers(traced.view)
    for phase in traced.job.phases:
        joined, total, p2p_joined, p2p = numbers.get(phase, (0, 0, 0, 0))
        print(f"twin workload {phase}: collectives joined {joined}/{total}, grouped send/recv {p2p_joined}/{p2p}")
        assert total > 0
