"""A CPU PyTorch training loop of fixed work that prints its wall time (the workload of the
issue-7 benchmark: untraced vs ``otel-ebpf run`` with the torch receiver's default probes vs
``torch.profiler``).

Fixed work: a 3-layer MLP (Linear 256->512, ReLU, Linear 512->512, ReLU, Linear 512->10),
cross-entropy loss, SGD with momentum, ``--steps`` steps (default 200) of a ``--batch`` (default
64) batch, seeded, on ``--threads`` (default 1) intra-op threads so runs are comparable.
``--profiler`` wraps the loop in ``torch.profiler.profile(activities=[CPU])`` (its trace is
built but not written). Prints one JSON line: {"steps", "batch", "wall_s", "ms_per_step",
"profiler", "final_loss"}; the wall time covers the loop only (not ``import torch``).

    python bench/torch_loop.py [--steps N] [--batch B] [--threads T] [--profiler]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any


def build(batch: int) -> tuple[Any, Any, Any, Any, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 256)
    y = torch.randint(0, 10, (batch,))
    return torch, model, opt, x, y


def train(steps: int, batch: int, profiler: bool) -> tuple[float, float]:
    """Run ``steps`` training steps; returns (wall seconds of the loop, final loss)."""
    torch, model, opt, x, y = build(batch)
    loss_fn = torch.nn.CrossEntropyLoss()
    ctx: Any = contextlib.nullcontext()
    if profiler:
        from torch.profiler import ProfilerActivity, profile

        ctx = profile(activities=[ProfilerActivity.CPU])
    loss = None
    t0 = time.perf_counter()
    with ctx:
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
    wall = time.perf_counter() - t0
    return wall, float(loss.detach()) if loss is not None else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--profiler", action="store_true", help="wrap the loop in torch.profiler (CPU activity)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.threads < 1:
        ap.error("--steps, --batch and --threads must be >= 1")
    import torch

    torch.set_num_threads(args.threads)
    wall, loss = train(args.steps, args.batch, args.profiler)
    print(json.dumps({"steps": args.steps, "batch": args.batch, "threads": args.threads, "wall_s": round(wall, 6),
                      "ms_per_step": round(wall / args.steps * 1e3, 4), "profiler": args.profiler,
                      "final_loss": round(loss, 6)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
