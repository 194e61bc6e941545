"""GPU proof workload: a one-rank NCCL process group with DDP on one GPU, optionally under torch.profiler.

World size 1 still creates a real NCCL communicator and runs real NCCL collectives (DDP's gradient all-reduce
buckets, an explicit all_reduce, a broadcast and an all_to_all_single). NCCL 2.28 short-cuts a one-rank
communicator's collectives in ``taskAppend`` (``src/enqueue.cc``: ``nRanks == 1`` -> ``ncclLaunchOneRank``, a
cudaMemcpyAsync, nothing for in-place, a small kernel only for PreMulSum): no plan, no kernel channels, so no
profiler-plugin events and no ncclDevKernel for them. The all-to-all goes down the p2p path instead (a send and a
recv to itself), which is expected to launch NCCL's kernel (not yet seen on a GPU); steps.py reports what each side
saw rather than assuming. Writes ``--out`` (JSON): the window's bounds, the collectives torch issued in it, and
with ``--profile`` the profiler's kernels whose name says NCCL, with their durations in ns. Environment:
MASTER_ADDR/MASTER_PORT (set by steps.py).
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import profiling
import torch
import torch.distributed as dist


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    model = torch.nn.Sequential(torch.nn.Linear(a.width, a.width), torch.nn.ReLU(),
                                torch.nn.Linear(a.width, a.width)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=4)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.ones(64, a.width, device="cuda")
    buf = torch.ones(1 << 20, device="cuda")
    a2a_out = torch.empty_like(buf)
    issued = {"allreduce_explicit": 0, "broadcast_explicit": 0, "alltoall_explicit": 0}

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        ddp(x).sum().backward()
        opt.step()
        dist.all_reduce(buf)
        dist.broadcast(buf, src=0)
        # a send/recv to itself: NCCL's p2p path (a kernel with channels), not the one-rank copy shortcut
        dist.all_to_all_single(a2a_out, buf)
        issued["alltoall_explicit"] += 1
        issued["allreduce_explicit"] += 1
        issued["broadcast_explicit"] += 1

    step()  # warm-up: DDP's first backward builds its buckets
    torch.cuda.synchronize()
    issued = {k: 0 for k in issued}
    time.sleep(a.pause)
    prof = profiling.start(a.profile)
    t0 = time.time_ns()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    t1 = time.time_ns()
    result: dict[str, Any] = {"t0_ns": t0, "t1_ns": t1, "steps": a.steps, "issued": issued,
                              "nccl_version": ".".join(map(str, torch.cuda.nccl.version()))}
    if prof is not None:
        events = profiling.stop(prof).get("traceEvents", [])
        result["profiler_nccl_kernels"] = [
            {"name": e["name"][:80], "ts_us": e["ts"], "dur_ns": int(float(e.get("dur", 0)) * 1000)}
            for e in events if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()]
        result["profiler_kernels"] = sum(1 for e in events if e.get("cat") == "kernel")
    time.sleep(a.pause)
    dist.destroy_process_group()
    with open(a.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
