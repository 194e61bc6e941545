"""Workloads DDP, ``new_group`` subsets, MoE-style uneven all-to-all and pipeline parallel, one phase each, run by
tests/twin/test_workloads.py under torchrun on 4 ranks (options and record: wl_common.py).

* ``ddp``: DistributedDataParallel over the world (its init broadcast and shape check, the gradient bucket
  all-reduces of each backward).
* ``new_group``: ``new_group([3, 1])`` and ``new_group([0, 2, 3])`` (ranks outside take part in the split
  with NCCL_SPLIT_NOCOLOR and then do nothing on it); members all-reduce, all-gather and broadcast on them.
* ``moe``: uneven ``all_to_all_single`` over the world, a different split each step (torch issues one NCCL
  group of ncclSend/ncclRecv, torch/csrc/cuda/nccl.cpp ``all2all_single_unequal_split``; some pairs send 0).
* ``pp``: a 4-stage ``torch.distributed.pipelining`` GPipe schedule, forward only, 4 microbatches: stages
  exchange activations with ``batch_isend_irecv`` (grouped ncclSend/ncclRecv). Shapes are given
  (``input_args``/``output_args``): inference needs a kernel, which the twin does not run.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.nn.parallel import DistributedDataParallel
from wl_common import Job


def ddp(job: Job) -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(job.device)
    wrapped = DistributedDataParallel(model, device_ids=[job.device.index])
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    for i in range(job.args.steps):
        job.step(i)
        wrapped(torch.ones(8, 16).to(job.device)).sum().backward()
        opt.step()
        opt.zero_grad()


def new_group(job: Job) -> None:
    subsets = {"new_group_31": dist.new_group([3, 1]), "new_group_023": dist.new_group([0, 2, 3])}
    for name, group in subsets.items():
        job.record(name, group)
    for i in range(job.args.steps):
        job.step(i)
        for group in subsets.values():
            if job.rank not in dist.get_process_group_ranks(group):
                continue
            t = job.tensor([float(job.rank)])
            dist.all_reduce(t, group=group)
            gathered = [torch.empty(1, device=job.device) for _ in range(dist.get_world_size(group))]
            dist.all_gather(gathered, t, group=group)
            dist.broadcast(t, group_src=0, group=group)


def moe(job: Job) -> None:
    r, w = job.rank, job.world
    for i in range(job.args.steps):
        job.step(i)
        send_sizes = [(r + d + i) % 3 for d in range(w)]
        recv_sizes = [(s + r + i) % 3 for s in range(w)]
        send = job.tensor([float(100 * r + d) for d in range(w) for _ in range(send_sizes[d])])
        recv = torch.empty(sum(recv_sizes), device=job.device)
        dist.all_to_all_single(recv, send, output_split_sizes=recv_sizes, input_split_sizes=send_sizes)


def pp(job: Job) -> None:
    microbatch = torch.empty(2, 2, device=job.device)
    stage = PipelineStage(nn.Identity(), job.rank, job.world, job.device, input_args=(microbatch,),
                          output_args=(microbatch,))
    schedule = ScheduleGPipe(stage, n_microbatches=4)
    for i in range(job.args.steps):
        job.step(i)
        if job.rank == 0:
            schedule.step(torch.arange(16, dtype=torch.float32).reshape(8, 2).to(job.device))
        else:
            schedule.step()


if __name__ == "__main__":
    Job().run({"ddp": ddp, "new_group": new_group, "moe": moe, "pp": pp})
