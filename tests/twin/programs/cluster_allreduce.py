"""Run by tests/twin/test_cluster.py on 2 nodes x 2 ranks: three all_reduces of real data across the nodes.

Each rank checks the sum (1 + 2 + 3 + 4 = 10: host copies in and out, which the twin performs for real) and
prints ``cluster rank=<r> host=<host name> sum=<value>``; a wrong sum exits 1."""
import os
import socket
import sys

import torch
import torch.distributed as dist

device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank = dist.get_rank()
total = 0.0
for _ in range(3):
    t = torch.tensor([rank + 1.0]).to(device)
    dist.all_reduce(t)
    total = t.cpu().item()
    if total != 10.0:
        sys.exit(f"rank {rank}: all_reduce gave {total}, not 10")
torch.cuda.synchronize()
# one write: under PYTHONUNBUFFERED print() writes the text and its newline separately, and ranks share a pipe
sys.stdout.write(f"cluster rank={rank} host={socket.gethostname()} sum={total}\n")
dist.destroy_process_group()
