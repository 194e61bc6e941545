"""``otel-ebpf demo``: a simulated multi-node data-parallel training job on one machine, no GPU.

:mod:`.runner` (orchestration: ``DemoOptions``, ``run``), :mod:`.netns` (one network + UTS namespace per
node), :mod:`.worker` (a node's launcher and ranks: the real CUDA runtime, a stand-in NCCL),
:mod:`.summary` (the report read back from the gateway's files), :mod:`.build` (the stand-in
libnccl.so.2, ``stand_in_nccl.c``, shared with the tests). Needs root, BCC, iproute2,
util-linux, gcc and the nvidia-cuda-runtime-cu12 wheel (``pip install 'otel-ebpf[demo]'``).
"""
from __future__ import annotations

# Nothing is imported here: every rank runs ``python -m otel_ebpf.demo.worker`` and the tests
# import ``.build``; neither needs the runner.
__all__: list[str] = []
