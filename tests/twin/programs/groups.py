"""Run by tests/twin/test_groups.py under torchrun on the twin (4 ranks): subgroups made by ncclCommSplit.

``new_group([3, 1])``: torch sorts the ranks and splits with key = group rank, so NCCL must give global
rank 1 child rank 0 and global rank 3 child rank 1; ranks 0 and 2 take part with NCCL_SPLIT_NOCOLOR.
``split_group([[2, 0], [3, 1]])``: two colors at once. Every member reports torch's view
(``dist.get_rank(group)``) and what the collectives on the group moved, which only agrees with torch's
view when NCCL ordered the child's ranks as torch expects.
"""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

out = Path(sys.argv[1])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank = dist.get_rank()
found: dict[str, object] = {"rank": rank}


def probe(group: dist.ProcessGroup) -> dict[str, object]:
    mine = torch.tensor([float(rank)]).to(device)
    gathered = [torch.tensor([-1.0]).to(device) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    total = mine.clone()
    dist.all_reduce(total, group=group)
    first = torch.tensor([float(rank)]).to(device)
    dist.broadcast(first, group_src=0, group=group)
    return {"group_rank": dist.get_rank(group), "group_size": dist.get_world_size(group),
            "all_gather": [g.cpu().item() for g in gathered], "all_reduce": total.cpu().item(),
            "broadcast_from_group_rank_0": first.cpu().item()}


odd = dist.new_group([3, 1])
if rank in (1, 3):
    found["new_group"] = probe(odd)
pair = dist.split_group(split_ranks=[[2, 0], [3, 1]])
assert pair is not None  # every rank is in one of the two
found["split_group"] = probe(pair)
world = torch.tensor([1.0]).to(device)
dist.all_reduce(world)  # the world communicator still works after the splits
found["world_all_reduce"] = world.cpu().item()
(out / f"rank{rank}.json").write_text(json.dumps(found))
dist.destroy_process_group()
