"""A training job's NCCL rank spans as the gateway's collective join sees them, for the persistent-straggler tests
and the figures in docs/collectives.md: ``steps`` steps of ``step_s`` seconds, ``per_step`` collectives each, every
rank's host shifted by noise drawn once per step (uniform 0..``noise`` x step: its later calls in the step are
shifted too, as an asynchronous host is until its next synchronisation; and with probability ``spike_p`` a
hiccup of ``spike`` x step more, a GC pause or a slow batch) plus ``jitter_s`` per call, and from step
``slow_from`` the rank ``slow`` late by ``delay`` x step more.

``python -m tests.unit.processors.straggler_sim`` prints false-alarm and detection figures over many seeds.
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field

from otel_ebpf.core.events import LogRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.collective_join import CollectiveJoin, Config
from otel_ebpf.processors.collective_join.stragglers import EVENT_NAME
from tests.support import nccl_spans

T0 = 1_700_000_000_000_000_000


@dataclass
class Outcome:
    raised: list[tuple[int, int]]  # (rank, step) of each raise
    cleared: list[tuple[int, int]]
    records: list[LogRecord] = field(default_factory=list)  # every straggler record, in order


def simulate(seed: int, *, nranks: int = 4, steps: int = 200, per_step: int = 20, step_s: float = 0.075,
             noise: float = 0.025, jitter_s: float = 50e-6, slow: int | None = None, delay: float = 0.05,
             slow_from: int = 0, spike_p: float = 0.0, spike: float = 0.0, **straggler_cfg: object) -> Outcome:
    rng = random.Random(seed)
    sink = ListConsumer()
    cfg = Config()
    for key, value in straggler_cfg.items():
        setattr(cfg.persistent_straggler, key, value)
    join = CollectiveJoin(cfg, Context(), sink, clock=lambda: 0.0, wall_ns=lambda: T0)
    out = Outcome([], [])
    seq = 0
    for step in range(steps):
        shift = [rng.uniform(0, noise * step_s) + (spike * step_s if rng.random() < spike_p else 0.0)
                 for _ in range(nranks)]
        if slow is not None and step >= slow_from:
            shift[slow] += delay * step_s
        batch = []
        for c in range(per_step):
            at = step * step_s + c * step_s / per_step
            for rank in range(nranks):
                start = T0 + int((at + shift[rank] + rng.gauss(0, jitter_s)) * 1e9)
                batch.append(nccl_spans.rank_span(seq, rank, start, nranks=nranks))
            seq += 1
        join.consume(batch)
        for rec in sink.take():
            if isinstance(rec, LogRecord) and rec.event_name == EVENT_NAME:
                out.records.append(rec)
                rank = int(rec.attributes["nccl.rank"])
                (out.raised if rec.attributes["nccl.straggler.state"] == "raised" else out.cleared).append((rank, step))
    return out


def figures(seeds: int, **kw: object) -> dict[str, float]:
    """Over ``seeds`` runs with a straggler from step ``slow_from`` and as many without: false alarms (a raise
    without a straggler, or before it or of another rank), right rank, and detection latency in steps."""
    slow_from = int(kw.pop("slow_from", 60))  # type: ignore[call-overload]
    false = right = 0
    latency: list[int] = []
    for seed in range(seeds):
        if simulate(10_000 + seed, **kw).raised:  # type: ignore[arg-type]
            false += 1
        hit = simulate(seed, slow=1, slow_from=slow_from, **kw).raised  # type: ignore[arg-type]
        if hit and hit[0][0] == 1 and hit[0][1] >= slow_from:
            right += 1
            latency.append(hit[0][1] - slow_from)
    latency.sort()
    pick = (lambda q: latency[min(len(latency) - 1, int(q * len(latency)))]) if latency else (lambda q: -1)
    return {"false_alarm": false / seeds, "right_rank": right / seeds, "p50_steps": pick(0.5),
            "p99_steps": pick(0.99), "max_steps": latency[-1] if latency else -1}


if __name__ == "__main__":
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    for nranks in (2, 4, 8):
        for step_s in (0.06, 0.09):
            for noise in (0.025, 0.05):
                f = figures(seeds, nranks=nranks, step_s=step_s, noise=noise, steps=200)
                print(f"nranks={nranks} step={step_s * 1e3:.0f}ms noise=0..{noise:.1%} delay=5%: {f}", flush=True)
