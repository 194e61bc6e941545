"""Run by tests/twin/test_async.py under torchrun on the twin (2 ranks): NCCL work completes on its stream
after the call returns, as on a GPU, and torch sees that through its events.

Rank 1 reaches the all_reduce `late` seconds after rank 0. Rank 0 records, as torch's own code observes it:
how long the all_reduce call took, whether the Work was complete right after it (``is_completed``: a
cudaEventQuery on the end event), whether an event recorded on the current stream after ``work.wait()`` was
complete (that wait is a cudaStreamWaitEvent, not a host wait), how long the copy to the host then blocked,
and the value. Then both ranks time a collective with CUDA events on the NCCL stream's side of the current
stream, and rank 0 checks that stream-ordered copies after the collective see its result. Each rank writes
``<out>/rank<N>.json``.
"""
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

out, late = Path(sys.argv[1]), float(sys.argv[2])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank = dist.get_rank()
found: dict[str, object] = {"rank": rank}

dist.barrier()
torch.cuda.synchronize()
if rank == 1:
    time.sleep(late)
t = torch.full((1024,), rank + 1.0).to(device)
start = time.monotonic()
work = dist.all_reduce(t, async_op=True)
found["call_s"] = time.monotonic() - start
found["completed_after_call"] = work.is_completed()
work.wait()  # the current stream waits for the collective; the host does not
after = torch.cuda.Event()
after.record()
found["event_done_after_wait"] = after.query()
start = time.monotonic()
found["value"] = t.cpu()[0].item()  # a stream-ordered copy: blocks until the collective is done
found["copy_s"] = time.monotonic() - start
found["event_done_after_copy"] = after.query()

# Timed with CUDA events around the collective: the elapsed time is stream time, the wait for the peer.
dist.barrier()
torch.cuda.synchronize()
if rank == 1:
    time.sleep(late)
begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
begin.record()
dist.all_reduce(t)
# a copy placed on the stream after the collective sees its result, with no host synchronisation between
mirror = torch.empty_like(t)
mirror.copy_(t)
end.record()
end.synchronize()
found["event_ms"] = begin.elapsed_time(end)
found["mirror"] = mirror.cpu()[0].item()
(out / f"rank{rank}.json").write_text(json.dumps(found))
dist.destroy_process_group()
