"""A rank slow on the GPU while its host keeps time (issue 17's persistent straggler of kind ``gpu``): run by
tests/twin/test_hang_forensics.py under torchrun.

Each step: ``--host-ms`` of host work (a sleep, the same on every rank) plus its noise, ``U(0, noise-ms)`` drawn
per rank and step (as wl_straggle.py's), ``--launches`` elementwise kernels on the current stream, a world
all-reduce, then ``torch.cuda.synchronize()``. On rank ``--slow-rank`` the twin's libcudart makes every kernel
launch occupy its stream ``--kernel-us`` (``OTEL_EBPF_TWIN_KERNEL_US``, set before the first launch): its host
calls the all-reduce on time, but its stream reaches the collective ``launches x kernel-us`` later than its
peers' do, as a throttled or overloaded GPU would. The synchronize brings every host back in step (the peers'
all-reduce ends only once the slow rank's has run), so no rank's host is late to the next step.

Why the noise: without it the hosts arrive in lock-step, within the call's jitter, and which of them arrives
last is drawn anew only when the scheduler happens to delay one by a millisecond or more. The gateway counts
those new draws to learn the job's step, and names nobody before it has measured 8 steps between them
(collective_join/straggler_window.py, MIN_RUNS). Measured without the noise: in one run the 8th came 5 s into
the 7.5 s of 250 steps; rank 1 was named in 10 of 12 runs and not in the other 2 (nor in one CI run), so the
test failed on the machine's quiet, not on the gateway. Real jobs' hosts vary from step to step (data, Python,
the allocator); the noise, the same for every rank, gives a new draw on most steps and keeps the slow rank's
host on time.

Own options (wl_common's after them): ``--slow-rank``, ``--kernel-us``, ``--launches``, ``--host-ms``,
``--noise-ms``, ``--seed``, ``--steps-gpu`` (steps).

Writes ``<OUT>/gpu_slow<RANK>.json``: ``{"rank", "start_ns", "end_ns"}`` (epoch ns).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--kernel-us", type=int, default=2500)
parser.add_argument("--launches", type=int, default=4)
parser.add_argument("--host-ms", type=float, default=20.0)
parser.add_argument("--noise-ms", type=float, default=0.0)
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--steps-gpu", type=int, default=300)
own, rest = parser.parse_known_args(sys.argv[1:])
if int(os.environ["RANK"]) == own.slow_rank:  # before torch makes its first launch (the twin reads it once)
    os.environ["OTEL_EBPF_TWIN_KERNEL_US"] = str(own.kernel_us)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from wl_common import Job  # noqa: E402


def gpu_slow(job: Job) -> None:
    x = torch.ones(1024, device=job.device)
    rng = random.Random(own.seed * 1000 + job.rank)
    start = time.time_ns()
    for _ in range(own.steps_gpu):
        time.sleep((own.host_ms + rng.uniform(0.0, own.noise_ms)) / 1000)
        for _ in range(own.launches):
            x.mul_(1.0)
        dist.all_reduce(x)
        torch.cuda.synchronize()
    note = {"rank": job.rank, "start_ns": start, "end_ns": time.time_ns()}
    (job.args.out / f"gpu_slow{job.rank}.json").write_text(json.dumps(note))


if __name__ == "__main__":
    Job(rest).run({"gpu_slow": gpu_slow})
