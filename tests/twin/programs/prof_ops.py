"""Run by tests/twin/test_nccl_profiler.py under torchrun on the twin (2 ranks) with an NCCL profiler plugin named
by NCCL_PROFILER_PLUGIN: torch's own collectives, point-to-point and subgroup calls, each timed by the host.

In order: an all_reduce that rank 1 joins 0.3 s late (rank 0's stream waits for it: its kernel runs that long); a
4 MiB all_reduce (two channels); reduce_scatter_tensor and all_gather_into_tensor (FSDP2's pair); two all_reduces
coalesced into one NCCL group, the large one first; batch_isend_irecv both ways; a blocking send from rank 0 to
rank 1; all_to_all_single; broadcast; a new_group of both ranks (ncclCommSplit) and an all_reduce on it; last an
all_reduce captured in a CUDA graph and replayed twice.  ``<out>/rank<N>.json``: for each step its name and the
host's epoch ns before the call and after ``torch.cuda.synchronize()``, and the values that arrived.
"""
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

out = Path(sys.argv[1])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()
other = 1 - rank
steps: list[list[object]] = []
found: dict[str, object] = {"rank": rank, "pid": os.getpid(), "steps": steps}


def step(name: str, fn: Callable[[], object]) -> None:
    torch.cuda.synchronize()
    t0 = time.time_ns()
    fn()
    torch.cuda.synchronize()
    steps.append([name, t0, time.time_ns()])


late = torch.full((1024,), rank + 1.0).to(device)
if rank == 1:
    time.sleep(0.3)
step("late_all_reduce", lambda: dist.all_reduce(late))
found["late"] = late[:2].cpu().tolist()

big = torch.ones(1 << 20).to(device)
step("big_all_reduce", lambda: dist.all_reduce(big))

shard = torch.empty(512, device=device)
full = torch.arange(1024, dtype=torch.float32).to(device)
step("reduce_scatter", lambda: dist.reduce_scatter_tensor(shard, full))
gathered = torch.empty(2048, device=device)
step("all_gather", lambda: dist.all_gather_into_tensor(gathered, full))
found["gathered"] = gathered[1020:1030].cpu().tolist()

small, large = torch.ones(16).to(device), torch.ones(65536).to(device)


def coalesced() -> None:
    with dist._coalescing_manager(device=device):
        dist.all_reduce(large)
        dist.all_reduce(small)


step("coalesced", coalesced)
found["coalesced"] = [small[0].item(), large[0].item()]

mine = torch.full((8,), float(rank)).to(device)
theirs = torch.empty(8, device=device)


def batch() -> None:
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, other), dist.P2POp(dist.irecv, theirs, other)]):
        work.wait()


step("batch_p2p", batch)
found["theirs"] = theirs[:1].cpu().tolist()

blocking = torch.tensor([42.0, 43.0]).to(device) if rank == 0 else torch.empty(2, device=device)
step("send_recv", lambda: dist.send(blocking, dst=1) if rank == 0 else dist.recv(blocking, src=0))
found["blocking"] = blocking.cpu().tolist()

a2a_in = torch.full((4,), float(rank)).to(device)
a2a_out = torch.empty(4, device=device)
step("all_to_all", lambda: dist.all_to_all_single(a2a_out, a2a_in))
found["a2a"] = a2a_out.cpu().tolist()

root = torch.full((4,), float(rank + 7)).to(device)
step("broadcast", lambda: dist.broadcast(root, src=0))

sub = dist.new_group([0, 1])
on_sub = torch.ones(32).to(device)
step("sub_all_reduce", lambda: dist.all_reduce(on_sub, group=sub))

captured = torch.ones(64).to(device)
graph = torch.cuda.CUDAGraph()
torch.cuda.synchronize()


def capture() -> None:
    with torch.cuda.graph(graph):
        dist.all_reduce(captured)


step("capture", capture)
step("replay1", graph.replay)
step("replay2", graph.replay)
found["captured"] = captured[:1].cpu().tolist()  # 4: two replays of a sum over 2 ranks of ones

(out / f"rank{rank}.json").write_text(json.dumps(found))
dist.destroy_process_group()
