"""Run by tests/twin/test_p2p.py under torchrun on the twin (4 ranks): MoE-style uneven ``all_to_all_single``.

Rank r sends ``(r + d) % 3`` elements to rank d (so some pairs exchange nothing), valued ``100 r + 10 d + i``;
torch's NCCL backend issues it as one group of ncclSend/ncclRecv (torch/csrc/cuda/nccl.cpp
``all2all_single_unequal_split``). Data enters and leaves the simulated GPU by copies, so what each rank
reports is what NCCL moved. Also one even ``all_to_all_single`` (ncclAlltoAll in NCCL 2.28.9's API).
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
send_sizes = [(rank + d) % 3 for d in range(world)]
recv_sizes = [(s + rank) % 3 for s in range(world)]
values = [100 * rank + 10 * d + i for d in range(world) for i in range(send_sizes[d])]
send = torch.tensor(values, dtype=torch.float32).to(device)
recv = torch.empty(sum(recv_sizes), dtype=torch.float32, device=device)
dist.all_to_all_single(recv, send, output_split_sizes=recv_sizes, input_split_sizes=send_sizes)
even_send = torch.tensor([float(100 * rank + d) for d in range(world)]).to(device)
even_recv = torch.empty(world, device=device)
dist.all_to_all_single(even_recv, even_send)
torch.cuda.synchronize()
(out / f"rank{rank}.json").write_text(json.dumps({"uneven": recv.cpu().tolist(), "even": even_recv.cpu().tolist()}))
dist.destroy_process_group()
