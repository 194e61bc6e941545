"""Persistent stragglers on FSDP2: trials in which one rank (or none) is slowed on every step, each followed by a
clean stretch. Run by tests/twin/test_hang_forensics.py and bench/hang_forensics.py under torchrun (set-up and
record: wl_common.py).

Each step: a world all-reduce of :data:`wl_common.MARKER` elements and the input's host-to-device copy (pageable:
it waits for that all-reduce, so every step starts with the ranks in step), then each rank sleeps the step's
device time ``compute`` plus its noise, ``U(0, noise_frac x base)``, and the slowed rank ``slow_frac x base``
more, then FSDP2's forward and backward (per-layer all-gathers and reduce-scatters on the world communicator) and
the optimizer. So a slowed rank starts every collective of its step but the first late, as a rank with a slow
data loader, a slow GPU or a noisy neighbour does. ``base`` is the step time measured over the warm-up (each
rank's median, the largest of the ranks', agreed by an all-reduce).

Why the sleep, the all-reduce and one layer: the twin's kernels take no time, so without the sleep a step is
only host work, and 4 ranks sharing 2 CPUs start their collectives 10-40 ms apart by the scheduler's draw, which
drowns a 5-10 % slowdown of a 50 ms step (a GPU step is mostly device time the host waits for). Without the
all-reduce a rank that was last to finish a step's host work starts the next one last too, for seconds on end
(measured: one rank last in 35 collectives in a row with nobody slowed). Each FSDP2 layer adds host work the ranks
contend for: with 6 layers the ranks' arrivals spread 50 ms (median) with nobody slowed, with one 7 ms.

Own options (wl_common's after them): ``--trials 2,-1,1`` (the slowed global rank of each trial, -1: none),
``--slow-frac``, ``--noise-frac``, ``--warmup-steps`` (they measure ``base``), ``--lead-s`` (clean steps after
the warm-up, before the first trial), ``--slow-s`` (each trial's slowed stretch, the same length when nobody is
slowed), ``--clean-s`` (the clean stretch after it), ``--layers``, ``--compute-ms``, ``--seed``. Seconds become
step counts from the agreed ``base``, the same on every rank, never one rank's clock: every rank makes the same
calls.

Each rank writes ``<OUT>/trials<RANK>.json``: ``{"rank", "host", "base_ns", "slow_frac", "noise_frac", "trials":
[{"rank", "start_ns", "slow_end_ns", "end_ns", "steps"}]}`` (host epoch ns on that rank: its first step of the
trial once the ranks are in step, i.e. when a slowed rank starts its first late sleep; the end of the slowed
stretch; the end of the clean one; ``steps``: [slowed, clean]).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from wl_common import MARKER, Job

WARMUP_MIN_STEPS = 5


class Trainer:
    """One rank's FSDP2 model and its step, with the injected sleeps."""

    def __init__(self, job: Job, layers: int, compute: float, noise_frac: float, seed: int) -> None:
        mesh = init_device_mesh("cuda", (job.world,), mesh_dim_names=("dp",))
        job.record("straggle_dp", mesh.get_group("dp"))
        self.job = job
        blocks: list[nn.Module] = []
        for _ in range(layers):
            blocks += [nn.Linear(16, 16), nn.ReLU()]
        self.model = nn.Sequential(*blocks).to(job.device)
        for layer in self.model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.compute, self.noise_frac = compute, noise_frac
        self.rng = random.Random(seed * 1000 + job.rank)
        self.base = 0.0

    def step(self, delay: float) -> int:
        """One step; sleeps its noise plus ``delay`` s once the ranks are in step. Returns that time (epoch ns)."""
        dist.all_reduce(self.job.tensor([0.0] * MARKER))  # the ranks in step: see the module doc
        x = torch.ones(8, 16).to(self.job.device)
        start = time.time_ns()
        time.sleep(self.compute + delay + self.rng.uniform(0.0, self.noise_frac * self.base))
        self.model(x).sum().backward()
        self.opt.step()
        self.opt.zero_grad()
        return start

    def warm_up(self, steps: int) -> None:
        """``steps`` steps (noise drawn on a first guess of the step time), then agrees ``base``."""
        times: list[float] = []
        self.base = self.compute + 0.05
        for _ in range(max(steps, WARMUP_MIN_STEPS)):
            t = time.monotonic()
            self.step(0.0)
            times.append(time.monotonic() - t)
        mine = torch.tensor([statistics.median(times[1:])], dtype=torch.float64).to(self.job.device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        self.base = float(mine.cpu()[0])


def straggle(job: Job, own: argparse.Namespace) -> None:
    trainer = Trainer(job, own.layers, own.compute_ms / 1e3, own.noise_frac, own.seed)
    trainer.warm_up(own.warmup_steps)
    base = trainer.base
    slowed_step = base * (1 + own.slow_frac + own.noise_frac / 2)
    slow_steps = math.ceil(own.slow_s / slowed_step)
    clean_steps = math.ceil(own.clean_s / (base * (1 + own.noise_frac / 2)))
    for _ in range(math.ceil(own.lead_s / (base * (1 + own.noise_frac / 2)))):  # a clean window before trial 1
        trainer.step(0.0)
    trials: list[dict[str, Any]] = []
    for rank in (int(r) for r in own.trials.split(",") if r):
        delay = own.slow_frac * base if job.rank == rank else 0.0
        start = trainer.step(delay)
        for _ in range(slow_steps - 1):
            trainer.step(delay)
        slow_end = time.time_ns()
        for _ in range(clean_steps):
            trainer.step(0.0)
        trials.append({"rank": rank, "start_ns": start, "slow_end_ns": slow_end, "end_ns": time.time_ns(),
                       "steps": [slow_steps, clean_steps]})
    note = {"rank": job.rank, "host": socket.gethostname(), "base_ns": int(base * 1e9), "slow_frac": own.slow_frac,
            "noise_frac": own.noise_frac, "trials": trials}
    (job.args.out / f"trials{job.rank}.json").write_text(json.dumps(note))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", default="2")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--compute-ms", type=float, default=300.0)
    parser.add_argument("--slow-frac", type=float, default=0.10)
    parser.add_argument("--noise-frac", type=float, default=0.0)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--slow-s", type=float, default=4.0)
    parser.add_argument("--clean-s", type=float, default=4.0)
    parser.add_argument("--lead-s", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    own, rest = parser.parse_known_args(argv)
    job = Job(rest)
    job.run({"straggle": lambda j: straggle(j, own)})


if __name__ == "__main__":
    main(sys.argv[1:])
