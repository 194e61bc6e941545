"""Workloads FSDP2, HSDP and tensor parallel, one phase each, run by tests/twin/test_workloads.py under torchrun
on 4 ranks (options and record: wl_common.py). Training steps run forward, backward and the optimizer; kernels do
nothing on the twin, so the values are meaningless, but every collective torch issues is real.

* ``fsdp2``: ``fully_shard`` on each layer and the root over a 1-D mesh of the 4 ranks (per-layer all-gathers,
  reduce-scatters).
* ``hsdp``: ``fully_shard`` over a 2-D DeviceMesh ``("replicate", "shard")`` = (2, 2): all-gathers and
  reduce-scatters within a shard group, gradient all-reduces across the replicate group.
* ``tp``: DTensor ``parallelize_module`` with ``ColwiseParallel`` then ``RowwiseParallel`` on the ``tp``
  dimension of a (2, 2) ``("dp", "tp")`` mesh: the row-parallel output all-reduce in forward.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from wl_common import Job


def _mlp(job: Job) -> nn.Sequential:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)).to(job.device)


def _record_mesh(job: Job, prefix: str, mesh: DeviceMesh) -> None:
    for dim in mesh.mesh_dim_names or ():
        job.record(f"{prefix}_{dim}", mesh.get_group(dim))


def _train(job: Job, model: nn.Module) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(job.args.steps):
        job.step(i)
        model(torch.ones(8, 16).to(job.device)).sum().backward()
        opt.step()
        opt.zero_grad()


def fsdp2(job: Job) -> None:
    mesh = init_device_mesh("cuda", (job.world,), mesh_dim_names=("dp",))
    _record_mesh(job, "fsdp2", mesh)
    model = _mlp(job)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _train(job, model)


def hsdp(job: Job) -> None:
    mesh = init_device_mesh("cuda", (2, job.world // 2), mesh_dim_names=("replicate", "shard"))
    _record_mesh(job, "hsdp", mesh)
    model = _mlp(job)
    fully_shard(model, mesh=mesh)
    _train(job, model)


def tp(job: Job) -> None:
    mesh = init_device_mesh("cuda", (2, job.world // 2), mesh_dim_names=("dp", "tp"))
    _record_mesh(job, "tp", mesh)
    model = parallelize_module(_mlp(job), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    _train(job, model)


if __name__ == "__main__":
    Job().run({"fsdp2": fsdp2, "hsdp": hsdp, "tp": tp})
