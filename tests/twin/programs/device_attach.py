"""Run by tests/twin/test_device_attach.py on the twin, NOT under the agent at first: a process that chose its GPU
before the agent attached (``otel-ebpf run --pid``, an agent restart under a running job). It sets device 1 the way
a LOCAL_RANK 1 process does (``torch.cuda.set_device``), warms up, writes ``<out>/ready`` and waits for
``<out>/go`` (at most 120 s); then runs elementwise ops on cuda:1, whose launches the agent must count on device
1, and writes ``<out>/done``."""
import sys
import time
from pathlib import Path

import torch

out = Path(sys.argv[1])
torch.cuda.set_device(1)  # cudaSetDevice(1): before the agent is there
x = torch.ones(4096, device="cuda")
torch.cuda.synchronize()
(out / "ready").write_text("")
deadline = time.monotonic() + 120
while not (out / "go").exists():
    if time.monotonic() > deadline:
        sys.exit("no go within 120 s")
    time.sleep(0.05)
for _ in range(10):
    x = x * 2 + 1  # mul, add: each asks c10::cuda::current_device (cudaGetDevice) before it launches
torch.cuda.synchronize()
(out / "done").write_text(str(x.sum().item()))
