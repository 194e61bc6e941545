"""Run by tests/twin/test_nccl_traced.py under torchrun and the agent on the twin (4 ranks): every kind of
subgroup PyTorch makes with ncclCommSplit, each used by collectives, and torch's own view of each written out.

``init_process_group(..., device_id=...)`` (what FSDP2 and DeviceMesh do) makes torch create every subgroup
with ``ncclCommSplit`` off the world communicator: ``new_group([3, 1])`` (ranks 0 and 2 take part with
NCCL_SPLIT_NOCOLOR), ``split_group([[2, 0], [3, 1]])`` (two colors at once) and both dimensions of a 2x2
``init_device_mesh``. Each rank writes ``rank<N>.json``: its pid and, per group, the group's global ranks,
``dist.get_rank(group)`` and ``dist.get_world_size(group)``.
"""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

out = Path(sys.argv[1])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank = dist.get_rank()
groups: list[dict[str, object]] = []


def use(name: str, group: dist.ProcessGroup | None) -> None:
    """One all_reduce and one all_gather on ``group``; records torch's view of it."""
    t = torch.tensor([float(rank)]).to(device)
    dist.all_reduce(t, group=group)
    gathered = [torch.zeros(1).to(device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, t, group=group)
    torch.cuda.synchronize()
    groups.append({"name": name, "members": dist.get_process_group_ranks(group or dist.group.WORLD),
                   "rank": dist.get_rank(group), "size": dist.get_world_size(group)})


use("world", None)
odd = dist.new_group([3, 1])
if rank in (1, 3):
    use("new_group", odd)
pair = dist.split_group(split_ranks=[[2, 0], [3, 1]])
assert pair is not None
use("split_group", pair)
mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
use("mesh_dp", mesh.get_group("dp"))
use("mesh_tp", mesh.get_group("tp"))
(out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "pid": os.getpid(), "groups": groups}))
dist.destroy_process_group()
