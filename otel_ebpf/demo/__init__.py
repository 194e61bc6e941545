"""``otel-ebpf demo``: a real PyTorch training job on simulated GPUs across namespace nodes, traced (no GPU).

:mod:`.runner` (``DemoOptions``, ``run``: the job on :func:`otel_ebpf.twin.cluster.run_cluster`), :mod:`.train`
(the job: FSDP2 + tensor parallel, run by the twin's torch, never imported here), :mod:`.summary` (the report
read back from the gateway's files), :mod:`.build` (the older stand-in libnccl.so.2, ``stand_in_nccl.c``, which
the BPF tests still drive). Needs root, BCC, iproute2, util-linux, gcc and the twin's environment
(scripts/setup.sh makes ``.venv-twin``).
"""
from __future__ import annotations

# Nothing is imported here: the twin's Python runs ``train.py`` as a file and the tests import ``.build`` or
# ``.summary``; none needs the runner.
__all__: list[str] = []
