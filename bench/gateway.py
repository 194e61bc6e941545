"""Collective-join throughput and memory, in process: rank spans/s and RSS growth.

    .venv/bin/python bench/gateway.py [--ranks 1024] [--collectives 200] [--batch 512]

Run with the collector settings the gateway sets (otel_ebpf.core.gctune; ``--default-gc``: CPython's).
Spans are pre-built SDK ReadableSpans, as the gateway's OTLP receiver makes them (the agent's
ids and attributes; 8 ranks per host resource), so only ``CollectiveJoin.consume`` is timed,
including building the output spans (every rank span with nccl.wait_ns, one root per
collective); the next stage only counts. Scenarios:

* ``in order``: each collective's ranks arrive together (every collective completes at once);
* ``interleaved``: 8 collectives in flight, ranks arriving round-robin across them;
* ``one rank hung``: rank N-1 never arrives, so every collective stays pending until its
  timeout (the clock is advanced at the end): the store's memory per held span.

RSS (/proc/self/statm) growth over each scenario: the peak (read after every batch) and what
stays after it. The input spans are built before (their size is printed: that is what the
store holds while collectives wait). Desync warnings are silenced. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags

from otel_ebpf.core import gctune
from otel_ebpf.core.events import Tick
from otel_ebpf.core.pipeline import Context
from otel_ebpf.processors.collective_join import CollectiveJoin, Config
from otel_ebpf.core.ids import collective_ids

COMM = "5eed5eed5eed5eed"
SAMPLED = TraceFlags(TraceFlags.SAMPLED)
SCOPE = InstrumentationScope("otel_ebpf.nccl")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class Counter:
    def __init__(self) -> None:
        self.spans = 0

    def consume(self, events: Sequence[object]) -> None:
        self.spans += sum(1 for e in events if isinstance(e, ReadableSpan))


def build(ranks: int, collectives: int, skip_rank: int | None = None) -> list[list[ReadableSpan]]:
    """spans[seq] = that collective's rank spans, rank order."""
    hosts = [Resource.create({"host.name": f"node-{h}", "service.name": "train"}) for h in range(ranks // 8 + 1)]
    t0 = time.time_ns()
    out = []
    for seq in range(collectives):
        row = []
        for rank in range(ranks):
            if rank == skip_rank:
                continue
            trace, parent, span = collective_ids(COMM, seq, rank)
            start = t0 + seq * 1_000_000 + (rank * 7919) % 50_000
            attrs = {"nccl.op": "AllReduce", "nccl.count": 1 << 20, "nccl.datatype": "bfloat16",
                     "nccl.bytes": 2 << 20, "nccl.redop": "sum", "nccl.timing": "host_enqueue", "nccl.seq": seq,
                     "nccl.comm.id": COMM, "nccl.rank": rank, "nccl.nranks": ranks, "thread.id": 1000 + rank,
                     "nccl.stream": "0x7f00", "nccl.device": rank % 8}
            row.append(ReadableSpan("ncclAllReduce", context=SpanContext(trace, span, False, SAMPLED),
                                    parent=SpanContext(trace, parent, True, SAMPLED), resource=hosts[rank // 8],
                                    attributes=attrs, start_time=start, end_time=start + 40_000,
                                    instrumentation_scope=SCOPE))
        out.append(row)
    return out


def arrival(rows: list[list[ReadableSpan]], in_flight: int) -> list[ReadableSpan]:
    """Rank spans in arrival order with ``in_flight`` collectives interleaved round-robin."""
    order: list[ReadableSpan] = []
    for g in range(0, len(rows), in_flight):
        group = rows[g:g + in_flight]
        for i in range(max(len(r) for r in group)):
            order.extend(r[i] for r in group if i < len(r))
    return order


def run(name: str, spans: list[ReadableSpan], batch: int, expire: bool) -> dict[str, object]:
    clock = [0.0]
    sink = Counter()
    join = CollectiveJoin(Config(), Context(), sink, clock=lambda: clock[0])
    batches = [spans[i:i + batch] for i in range(0, len(spans), batch)]
    gc.collect()
    before = peak = rss_mib()
    elapsed = 0.0
    for b in batches:
        t = time.perf_counter()
        join.consume(b)
        elapsed += time.perf_counter() - t
        peak = max(peak, rss_mib())
    pending = len(join.store)
    if expire:
        clock[0] = 60.0
        t = time.perf_counter()
        join.consume([Tick(0)])
        elapsed += time.perf_counter() - t
        peak = max(peak, rss_mib())
    gc.collect()
    return {"scenario": name, "rank spans": len(spans), "spans out": sink.spans, "seconds": elapsed,
            "rate": len(spans) / elapsed, "pending": pending, "peak": peak - before, "after": rss_mib() - before}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--collectives", type=int, default=200)
    p.add_argument("--batch", type=int, default=512, help="spans per consume() call (an OTLP request)")
    p.add_argument("--default-gc", action="store_true",
                   help="CPython's collector settings, not the ones otel-ebpf gateway sets (otel_ebpf.core.gctune)")
    args = p.parse_args(argv)
    if not args.default_gc:
        gctune.tune()
    logging.getLogger("otel_ebpf.processors.collective_join").setLevel(logging.ERROR)
    base = rss_mib()
    rows = build(args.ranks, args.collectives)
    built = rss_mib()
    results = [run("in order", [s for r in rows for s in r], args.batch, False)]
    del rows
    gc.collect()
    rows = build(args.ranks, args.collectives)  # the join keeps the spans it is given (adds nccl.wait_ns): new ones
    results.append(run("interleaved (8 in flight)", arrival(rows, 8), args.batch, False))
    del rows
    gc.collect()
    hung = build(args.ranks, args.collectives, skip_rank=args.ranks - 1)
    results.append(run("one rank hung (released at timeout)", [s for r in hung for s in r], args.batch, True))
    gcs = "CPython's default collector settings" if args.default_gc else "the gateway's collector settings"
    print(f"collective_join, {args.ranks} ranks x {args.collectives} collectives, batches of {args.batch}, {gcs}; "
          f"Python {sys.version.split()[0]}; input spans took {built - base:.0f} MiB to build\n")
    print("| scenario | rank spans | spans out | join seconds | rank spans/s | pending before timeout | "
          "RSS growth, peak (MiB) | RSS growth, after (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['scenario']} | {r['rank spans']:,} | {r['spans out']:,} | {r['seconds']:.3f} | "
              f"{r['rate']:,.0f} | {r['pending']} | {r['peak']:.1f} | {r['after']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
