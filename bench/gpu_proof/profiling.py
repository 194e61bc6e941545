"""torch.profiler around a workload's measured steps (train_step.py, ddp_step.py): started with CPU and CUDA
activities, stopped into its Chrome trace's events. Imported by the workloads as a sibling module (they run by
path under the image's python, next to this file)."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import torch


def start(enabled: bool) -> Any:
    """A running profiler, or None when not ``enabled``."""
    if not enabled:
        return None
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                              torch.profiler.ProfilerActivity.CUDA])
    prof.__enter__()
    return prof


def stop(prof: Any) -> dict[str, Any]:
    """Stop ``prof``; its Chrome trace (``traceEvents`` ...) as torch writes it."""
    prof.__exit__(None, None, None)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace: dict[str, Any] = json.load(f)
    return trace
