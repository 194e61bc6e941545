"""Run by tests/twin/test_cuda_traced.py under torchrun and the agent on the twin (1 rank): torch's own kernels,
launched the way torch 2.11 (CUDA 13) launches them: nvcc 13's ``<<<>>>`` stubs call ``__cudaLaunchKernel``
with a ``cudaKernel_t`` (libtorch_cuda.so imports that, not ``cudaLaunchKernel``). Elementwise ops, a
reduction and a copy, and events recorded and waited for across two streams: no cuBLAS (a stub on the twin).
Writes ``<out>/done`` when finished."""
import os
import sys
from pathlib import Path

import torch

out = Path(sys.argv[1])
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
x = torch.ones(4096, device=device)  # a fill kernel
for _ in range(10):
    x = x * 2 + 1  # mul, add
y = x.sum()  # a reduction
z = torch.zeros(4096, device=device)
z.copy_(x)  # a device-to-device copy
side = torch.cuda.Stream()  # cudaStreamCreateWithPriority
ev = torch.cuda.Event()
for _ in range(3):
    ev.record()  # cudaEventRecord on the current stream
    side.wait_event(ev)  # cudaStreamWaitEvent
    with torch.cuda.stream(side):
        w = x * 3
    torch.cuda.current_stream().wait_stream(side)  # a record on side, a wait on the current stream
torch.cuda.synchronize()
(out / "done").write_text(str(y.item()))
