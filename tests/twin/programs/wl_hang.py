"""A hang with a culprit: after a few good FSDP2 steps one rank stalls in a named Python function while the
others enter the step's world all-reduce and wait for it; then it goes on and the job ends normally. Run by
tests/twin/test_hang_forensics.py and bench/hang_forensics.py under torchrun (options and record:
wl_common.py).

Own options (before wl_common's): ``--stuck-rank R`` (global rank that stalls), ``--stuck-step K`` (the step,
of ``--steps``, at whose start it stalls), ``--stall S`` (seconds it stays in :func:`stuck_in_dataloader_fetch`).

The stuck rank writes ``<OUT>/hang.json`` = ``{"rank", "pid", "host", "start_ns", "end_ns"}`` (host epoch ns of
the stall's start and end; end null while it lasts) so a test can time what the agents saw against the stall.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.device_mesh import init_device_mesh
from wl_common import Job


def stuck_in_dataloader_fetch(seconds: float) -> None:
    """The culprit: one sleep, so the stack holds still while the agent looks (a data loader blocked on IO)."""
    time.sleep(seconds)


def _note(out: Path, start_ns: int, end_ns: int | None) -> None:
    note = {"rank": int(os.environ["RANK"]), "pid": os.getpid(), "host": socket.gethostname(),
            "start_ns": start_ns, "end_ns": end_ns}
    (out / "hang.json").write_text(json.dumps(note))


def hang(job: Job, stuck_rank: int, stuck_step: int, stall: float) -> None:
    mesh = init_device_mesh("cuda", (job.world,), mesh_dim_names=("dp",))
    job.record("hang_dp", mesh.get_group("dp"))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)).to(job.device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(job.args.steps):
        if i == stuck_step and job.rank == stuck_rank:
            start = time.time_ns()
            _note(job.args.out, start, None)
            stuck_in_dataloader_fetch(stall)
            _note(job.args.out, start, time.time_ns())
        job.step(i)  # the world all-reduce the others wait in while the stuck rank is away
        model(torch.ones(8, 16).to(job.device)).sum().backward()
        opt.step()
        opt.zero_grad()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stuck-rank", type=int, default=2)
    parser.add_argument("--stuck-step", type=int, default=3)
    parser.add_argument("--stall", type=float, default=25.0)
    own, rest = parser.parse_known_args(argv)
    job = Job(rest)
    job.run({"hang": lambda j: hang(j, own.stuck_rank, own.stuck_step, own.stall)})


if __name__ == "__main__":
    main(sys.argv[1:])
