"""Run by tests/twin/test_ddp.py under torchrun on the twin: a real all_reduce, then DDP for 2 steps.

Values enter "device" memory only by host copies (``.to(device)``) and leave it the same way, which the
twin performs for real; kernels do nothing there, so nothing below relies on a kernel's result. Each rank
writes its findings to ``<out>/rank<N>.json``.
"""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

out = Path(sys.argv[1])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()

t = torch.tensor([rank + 1.0, 10.0 * (rank + 1)]).to(device)
dist.all_reduce(t)
grads: list[list[list[float]]] = []
found = {"rank": rank, "world": world, "all_reduce": t.cpu().tolist(), "grads": grads}

model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)).to(device)
# Each rank's gradient is a value the test can predict: (rank + 1) everywhere, copied in from the host.
for p in model.parameters():
    p.register_hook(lambda g, _r=rank: torch.full(tuple(g.shape), _r + 1.0).to(g.device))  # type: ignore[no-untyped-call]
ddp = DistributedDataParallel(model, device_ids=[device.index])


# DDP checks these annotations at run time (they must be the objects, not strings)
def sum_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:  # type: ignore[name-defined]
    """DDP's default reduction divides by the world size in a kernel (a no-op on the twin); this hook sums
    the bucket with one all_reduce and nothing else, so every gradient must come out as 1 + 2 = 3."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    summed: torch.futures.Future[torch.Tensor] = work.get_future().then(lambda fut: fut.value()[0])
    return summed


ddp.register_comm_hook(None, sum_hook)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(2):
    opt.zero_grad()
    ddp(torch.ones(8, 4).to(device)).sum().backward()
    torch.cuda.synchronize()
    grads.append([p.grad.cpu().flatten().tolist() for p in model.parameters() if p.grad is not None])
    opt.step()
(out / f"rank{rank}.json").write_text(json.dumps(found))
dist.destroy_process_group()
