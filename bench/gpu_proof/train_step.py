"""GPU proof workload: a real PyTorch training step on one GPU, optionally under torch.profiler (Kineto/CUPTI).

Each step: a matmul-heavy MLP forward/backward/SGD step, a ``torch.compile``d function, and the replay of a CUDA
graph captured once (a forward of the MLP). Warm-up steps first (compilation, capture), then a pause, then the
measured window of ``--steps`` steps, then another pause: the agent's cumulative launch counters (exported every
0.1 s) read the same before the window as at its start and the same after it as at its end, so the window's
launches are the difference of two snapshots (bench/gpu_proof/steps.py), comparable with the profiler's count of
the same steps. Writes ``--out`` (JSON): the window's wall-clock bounds (epoch ns), per-step milliseconds, and with
``--profile`` the profiler's runtime/driver API calls and kernels, each kernel attributed to the API call that
launched it (correlation id). Run by the machine's own python (the GPU image's, or the twin's).
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from typing import Any

import profiling
import torch
import torch.nn.functional as F


def _profiled_counts(trace: dict[str, Any]) -> dict[str, Any]:
    """Runtime/driver API calls and kernels of a Kineto chrome trace, kernels keyed by the launching API."""
    apis: dict[int, str] = {}
    calls: Counter[str] = Counter()
    kernels: Counter[str] = Counter()
    names: Counter[str] = Counter()
    for e in trace.get("traceEvents", []):
        cat, args = e.get("cat"), e.get("args") or {}
        if cat in ("cuda_runtime", "cuda_driver"):
            calls[f"{cat}:{e['name']}"] += 1
            if "correlation" in args:
                apis[int(args["correlation"])] = e["name"]
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "kernel":
            api = apis.get(int((e.get("args") or {}).get("correlation", -1)), "?")
            kernels[api] += 1
            names[e["name"][:80]] += 1
    return {"api_calls": dict(calls), "kernels_by_api": dict(kernels), "kernels": sum(kernels.values()),
            "top_kernels": names.most_common(12)}


class Mlp(torch.nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return x


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--compile-backend", default="inductor", help="inductor on a GPU; aot_eager on the twin")
    ap.add_argument("--pause", type=float, default=1.0)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = Mlp(a.width, 4).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(a.batch, a.width, device=dev), torch.randn(a.batch, a.width, device=dev)
    w = torch.randn(a.width, a.width, device=dev)

    def fused(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (F.gelu(u @ v) * 0.5 + u.sin()).sum(dim=1)

    compiled = torch.compile(fused, backend=a.compile_backend)
    graph_model = Mlp(a.width, 2).to(dev).eval()
    static_x = torch.randn(a.batch, a.width, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            graph_model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        graph_model(static_x)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        compiled(x, w)
        graph.replay()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    time.sleep(a.pause)
    prof = profiling.start(a.profile)
    t0 = time.time_ns()
    step_ms = []
    for _ in range(a.steps):
        s = time.perf_counter()
        step()
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - s) * 1e3)
    t1 = time.time_ns()
    result: dict[str, Any] = {"t0_ns": t0, "t1_ns": t1, "steps": a.steps, "step_ms": step_ms,
                              "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if prof is not None:
        result["profiler"] = _profiled_counts(profiling.stop(prof))
    time.sleep(a.pause)
    with open(a.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
