"""The twin: the real PyTorch CUDA wheel (torch 2.11.0) running distributed programs with no GPU.

Stand-in ``libcudart.so.13`` (cudart*.c) and ``libnccl.so.2`` (nccl_comm.c, nccl_coll.c), compiled against the
real CUDA 13 and NCCL 2.28.9 headers, plus stubs generated from the wheel for the other CUDA libraries torch
links (stubs.py), let torch's own code paths run: ``init_process_group("nccl")``, ``new_group`` through
``ncclCommSplit``, DDP. Collectives move the ranks' real data through shared memory; kernels do nothing,
so values only a kernel would compute are meaningless, and timing is host timing. docs/twin.md says what
behaves like the real libraries and what does not yet.

    env = find_env()            # .venv-twin, made by scripts/setup.sh
    libdir = build(env)         # cached
    run = launch("train.py", nproc=2, timeout=120)
    run = run_cluster(ClusterSpec(Path("train.py"), nodes=2, gpus_per_node=2))  # namespace nodes, traced
"""
from __future__ import annotations

from otel_ebpf.twin.build import build
from otel_ebpf.twin.cluster import ClusterRun, ClusterSpec, run_cluster
from otel_ebpf.twin.env import TORCH_VERSION, TwinEnv, find_env
from otel_ebpf.twin.errors import TwinBuildError, TwinSetupError
from otel_ebpf.twin.launch import TwinRun, launch

__all__ = ["TORCH_VERSION", "ClusterRun", "ClusterSpec", "TwinBuildError", "TwinEnv", "TwinRun", "TwinSetupError",
           "build", "find_env", "launch", "run_cluster"]
