"""Run by tests/twin/test_p2p_traced.py under torchrun and the agent on the twin (4 ranks): every torch op that
NCCL 2.28.9 runs as a group of ncclSend/ncclRecv, then an estimated all_reduce and ``shrink_group``.

In order: uneven ``all_to_all_single`` (rank r sends ``(r + d) % 3`` elements to d), ``gather(dst=1)``,
``scatter(src=2)``, a ``batch_isend_irecv`` ring, a blocking ``send``/``recv`` from rank 0 to 3; then an
``all_reduce`` inside ``torch.distributed._time_estimator`` (ncclGroupStart .. ncclGroupSimulateEnd: nothing
runs) followed by a real ``all_reduce``; then ``shrink_group([2])`` (ncclCommShrink; rank 2 takes no part) and
one ``all_reduce`` on the shrunk group. Each rank writes ``rank<N>.json``: its pid, whether the estimate ran,
and its rank and size in the shrunk group (torch's view).
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
found: dict[str, object] = {"rank": rank, "pid": os.getpid()}

send_sizes = [(rank + d) % 3 for d in range(world)]
recv_sizes = [(s + rank) % 3 for s in range(world)]
recv = torch.empty(sum(recv_sizes), device=device)
dist.all_to_all_single(recv, torch.ones(sum(send_sizes)).to(device), output_split_sizes=recv_sizes,
                       input_split_sizes=send_sizes)
t = torch.ones(2).to(device)
dist.gather(t, [torch.empty(2, device=device) for _ in range(world)] if rank == 1 else None, dst=1)
dist.scatter(t, [torch.ones(2).to(device) for _ in range(world)] if rank == 2 else None, src=2)
got = torch.empty(2, device=device)
for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, t, (rank + 1) % world),
                                    dist.P2POp(dist.irecv, got, (rank - 1) % world)]):
    work.wait()
if rank == 0:
    dist.send(t, dst=3)
elif rank == 3:
    dist.recv(got, src=0)
torch.cuda.synchronize()

with dist._time_estimator() as estimate:
    dist.all_reduce(t)
found["estimated"] = estimate.estimated_time is not None
dist.all_reduce(t)
torch.cuda.synchronize()

if rank != 2:
    shrunk = dist.shrink_group([2])
    dist.all_reduce(t, group=shrunk)
    torch.cuda.synchronize()
    found["shrunk"] = [dist.get_rank(shrunk), dist.get_world_size(shrunk)]
(out / f"rank{rank}.json").write_text(json.dumps(found))
dist.destroy_process_group()
