"""Run by tests/twin/test_p2p.py under torchrun on the twin: ``dist.batch_isend_irecv`` around a ring.

Each rank sends two tensors to the next rank and receives two from the previous one, in one batch (torch
issues one NCCL group of ncclSend/ncclRecv). The second is 3 MiB, larger than the twin's per-pair ring, so
it must stream through while the same rank's recv drains its own ring. Then a blocking ``dist.send`` /
``dist.recv`` pair (a group of one each) from rank 0 to the last rank.
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
rank, world = dist.get_rank(), dist.get_world_size()
nxt, prev = (rank + 1) % world, (rank - 1) % world
small = torch.tensor([float(rank), float(rank) + 0.5]).to(device)
big = (torch.arange(786432, dtype=torch.float32) + 1000 * rank).to(device)  # 3 MiB
got_small = torch.empty(2, device=device)
got_big = torch.empty(786432, device=device)
ops = [dist.P2POp(dist.isend, small, nxt), dist.P2POp(dist.irecv, got_small, prev),
       dist.P2POp(dist.isend, big, nxt), dist.P2POp(dist.irecv, got_big, prev)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
found: dict[str, object] = {"small": got_small.cpu().tolist(), "big_first": got_big[:3].cpu().tolist(),
                            "big_last": got_big[-1:].cpu().tolist()}
if rank == 0:
    dist.send(torch.tensor([42.0, 43.0]).to(device), dst=world - 1)
elif rank == world - 1:
    blocking = torch.empty(2, device=device)
    dist.recv(blocking, src=0)
    found["blocking"] = blocking.cpu().tolist()
(out / f"rank{rank}.json").write_text(json.dumps(found))
dist.destroy_process_group()
