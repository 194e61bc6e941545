"""Run by tests/twin/test_async.py on 2 namespace nodes x 1 GPU: rank 1 exits after the first barrier; rank 0
then all-reduces with it. On a GPU, NCCL's network transport sees the closed connection, its proxy sets the
communicator's async error (ncclRemoteError), and torch's watchdog, polling ncclCommGetAsyncError, aborts the
communicator long before the collective's timeout. Rank 0 prints ``dead-peer start`` before the all-reduce
and ``dead-peer done`` if its host ever gets past it."""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT_S = 120  # the collective timeout: the test expects torch to react well before it

device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=TIMEOUT_S))
rank = dist.get_rank()
dist.barrier()
torch.cuda.synchronize()
if rank == 1:
    os._exit(7)
time.sleep(1.0)
print(f"dead-peer start t={time.monotonic():.3f}", flush=True)
t = torch.ones(16).to(device)
dist.all_reduce(t)
print(f"dead-peer value={t.cpu()[0].item()}", flush=True)
print(f"dead-peer done t={time.monotonic():.3f}", flush=True)
