"""Run by tests/twin/test_p2p.py under torchrun on the twin (2 ranks): a 2-stage
``torch.distributed.pipelining`` GPipe schedule, forward only, 4 microbatches.

Stage 0 is ``nn.Identity`` (no kernel: its output is its input), stage 1 records what reached it, so the
values stage 1 reports are what ncclSend/ncclRecv moved between the stages. Kernels do nothing on the twin,
so a stage that computed would pass on meaningless values; this one passes on real ones.
"""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

out = Path(sys.argv[1])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank = dist.get_rank()
seen: list[list[float]] = []


class Record(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seen.append(x.cpu().flatten().tolist())
        return x


# Shapes given, not inferred: inference sends pickled shapes with dist.send_object_list, whose receiver sizes
# its buffer with torch.sum on the device, a kernel, which the twin does not run.
microbatch = torch.empty(2, 2, device=device)
stage = PipelineStage(nn.Identity() if rank == 0 else Record(), rank, 2, device, input_args=(microbatch,),
                      output_args=(microbatch,))
schedule = ScheduleGPipe(stage, n_microbatches=4)
if rank == 0:
    batch = torch.arange(16, dtype=torch.float32).reshape(8, 2).to(device)
    schedule.step(batch)
else:
    schedule.step()
torch.cuda.synchronize()
(out / f"rank{rank}.json").write_text(json.dumps({"seen": seen}))
dist.destroy_process_group()
