"""Cost per span of the OTLP JSON lines file exporter's encoding: ``.venv/bin/python bench/file_export.py``.

Two ways to turn the same batches of SDK spans into the line ``traces.jsonl`` gets:

* ``sdk``: what the exporter did before issue 19, ``to_otlp_json(encode_spans(batch))``: the SDK's
  OTLP protobuf encoder, then protobuf's pure-Python ``json_format`` and the hex id rewrite;
* ``direct``: ``otel_ebpf.emit.otlp_json.spans_to_otlp_json(batch)``, what it does now.

The spans are built as the agent builds them (``otel_ebpf.emit.spans.SpanBuilder`` from
``SpanRecord``s): ``--spans`` of them (default 20,000) with ~12 attributes each (ints, strings,
floats, a bool, an int array: the CUDA/NCCL receivers' kind), a parent on 3 in 4, an event on 1 in
10, an error on 1 in 50, over ``--resources`` process resources (default 8, ~10 attributes each)
and 3 scopes, in batches of the exporters' default ``batch_size`` (512). Log records
(``otel_ebpf.emit.logs.LogBuilder``, ``--logs`` of them) go through ``encode_logs`` and
``logs_to_otlp_json`` the same way. Every round checks that both ways wrote the same lines.

The modes run interleaved, round by round (A, B, A, B, ...), so a load that comes and goes hits
both alike; each figure is the median of the rounds with their range, in thread CPU time (what
this thread spent, not waiting for a CPU) and in wall time. A last row times the exporter's whole
``export`` (encode, append, fsync) into a temporary directory. Prints a Markdown table; every
figure comes from this run.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BATCH = 512  # otel_ebpf.emit.exporters.BatchConfig.batch_size's default


def make_spans(n: int, n_resources: int, seed: int = 7) -> list[Any]:
    from opentelemetry.sdk.resources import Resource

    from otel_ebpf.core.events import SpanEventRecord, SpanRecord
    from otel_ebpf.emit.spans import SpanBuilder

    rng = random.Random(seed)
    resources = [Resource.create({"service.name": "train", "process.pid": 1000 + r, "process.parent_pid": 1,
                                  "process.executable.name": "python3",
                                  "process.command_line": f"python train.py --rank {r}", "host.name": "node-0",
                                  "host.id": "5f0c1e9a2b", "gpu.rank": r, "nccl.world_size": 8})
                 for r in range(n_resources)]
    scopes = ["otel_ebpf.cuda", "otel_ebpf.nccl", "otel_ebpf.python"]
    builder, spans = SpanBuilder(), []
    for i in range(n):
        start = 1_764_000_000_000_000_000 + i * 1_000
        attributes = {"thread.id": rng.randrange(1, 1 << 22), "process.pid": 1000 + i % n_resources,
                      "gpu.cuda.stream": rng.randrange(1 << 48), "gpu.cuda.bytes": rng.randrange(1 << 30),
                      "gpu.cuda.kind": rng.choice(["HtoD", "DtoH", "DtoD"]), "code.function": "cudaMemcpyAsync",
                      "hw.id": "GPU-5a1b2c3d-0000-1111-2222-333344445555", "gpu.cuda.async": rng.random() < 0.5,
                      "gpu.cuda.duration.ratio": rng.random(), "nccl.rank": i % 8, "nccl.ranks": (0, 1, 2, 3),
                      "otel_ebpf.seq": i}
        events = (SpanEventRecord("enqueued", start + 10, {"queue.depth": rng.randrange(64)}),) if i % 10 == 0 else ()
        spans.append(builder.build(SpanRecord(
            pid=1000 + i % n_resources, name="cudaMemcpyAsync", start_ns=start, end_ns=start + rng.randrange(1, 10**6),
            attributes=attributes, scope=scopes[i % 3], kind="client",
            parent_span_id=rng.randrange(1, 1 << 64) if i % 4 else None, trace_id=rng.randrange(1, 1 << 128),
            error="cudaErrorInvalidValue" if i % 50 == 0 else None, events=events), resources[i % n_resources]))
    return spans


def make_logs(n: int, n_resources: int) -> list[Any]:
    from opentelemetry.sdk.resources import Resource

    from otel_ebpf.core.events import LogRecord
    from otel_ebpf.emit.logs import LogBuilder

    resources = [Resource.create({"service.name": "train", "process.pid": 1000 + r}) for r in range(n_resources)]
    build = LogBuilder().build
    return [build(LogRecord(pid=1000 + i % n_resources, time_ns=1_764_000_000_000_000_000 + i,
                            event_name="otel_ebpf.nccl.straggler", body=f"rank {i % 8} late by {i % 97} ms",
                            attributes={"nccl.rank": i % 8, "nccl.comm": "9710c9a1", "nccl.late.ms": i % 97 / 3},
                            severity="WARN", scope="otel_ebpf.gateway", trace_id=i + 1, span_id=i + 1),
                  resources[i % n_resources]) for i in range(n)]


def batches(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i:i + BATCH] for i in range(0, len(items), BATCH)]


def timed(encode: Callable[[Sequence[Any]], str], parts: list[Sequence[Any]]) -> tuple[int, int, list[str]]:
    """(thread CPU ns, wall ns, lines) of encoding every batch."""
    cpu0, wall0 = time.thread_time_ns(), time.perf_counter_ns()
    lines = [encode(b) for b in parts]
    return time.thread_time_ns() - cpu0, time.perf_counter_ns() - wall0, lines


def run_pair(name: str, n: int, parts: list[Sequence[Any]], old: Callable[[Sequence[Any]], str],
             new: Callable[[Sequence[Any]], str], rounds: int) -> dict[str, list[float]]:
    """Interleaved rounds of ``old`` and ``new`` over the same batches: us per item, per round."""
    out: dict[str, list[float]] = {f"{name} sdk cpu": [], f"{name} sdk wall": [], f"{name} direct cpu": [],
                                   f"{name} direct wall": []}
    for r in range(rounds):
        order = [("sdk", old), ("direct", new)] if r % 2 == 0 else [("direct", new), ("sdk", old)]
        lines: dict[str, list[str]] = {}
        for mode, encode in order:
            cpu, wall, lines[mode] = timed(encode, parts)
            out[f"{name} {mode} cpu"].append(cpu / n / 1e3)
            out[f"{name} {mode} wall"].append(wall / n / 1e3)
        if lines["sdk"] != lines["direct"]:
            sys.exit(f"bench: {name}: the direct encoder's lines differ from the SDK path's in round {r}")
        print(f"round {r + 1}/{rounds} {name}: " + ", ".join(f"{k} {v[-1]:.1f} us" for k, v in out.items()),
              file=sys.stderr)
    return out


def export_cost(spans: list[Any], rounds: int) -> list[float]:
    """us per span of JsonLinesSpanExporter.export (encode, append, fsync), per round."""
    from otel_ebpf.emit.jsonfile import JsonLinesSpanExporter

    parts, per_round = batches(spans), []
    with tempfile.TemporaryDirectory(prefix="otel-ebpf-bench-") as tmp:
        for r in range(rounds):
            exporter = JsonLinesSpanExporter(Path(tmp) / str(r))
            wall0 = time.perf_counter_ns()
            for part in parts:
                exporter.export(part)
            per_round.append((time.perf_counter_ns() - wall0) / len(spans) / 1e3)
    return per_round


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def workload_parser(description: str) -> argparse.ArgumentParser:
    """The options of the workload (spans, log records, resources) and the rounds; bench/otlp_export.py's too."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--spans", type=int, default=20_000)
    ap.add_argument("--logs", type=int, default=5_000)
    ap.add_argument("--resources", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    return ap


def main(argv: list[str] | None = None) -> None:
    args = workload_parser(__doc__.split("\n\n")[0]).parse_args(argv)

    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_ebpf.core.otlpjson import to_otlp_json
    from otel_ebpf.emit.otlp_json import logs_to_otlp_json, spans_to_otlp_json

    spans, logs = make_spans(args.spans, args.resources), make_logs(args.logs, args.resources)
    results = run_pair("spans", len(spans), batches(spans), lambda b: to_otlp_json(encode_spans(b)),
                       spans_to_otlp_json, args.rounds)
    results |= run_pair("logs", len(logs), batches(logs), lambda b: to_otlp_json(encode_logs(b)),
                        logs_to_otlp_json, args.rounds)
    export = export_cost(spans, args.rounds)
    line = spans_to_otlp_json(spans[:BATCH])
    print(f"\n{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
          f"{os.getloadavg()[0]:.1f}; {len(spans)} spans ({len(line) / BATCH:.0f} bytes each in traces.jsonl), "
          f"{len(logs)} log records, {args.resources} resources, batches of {BATCH}, {args.rounds} interleaved rounds; "
          "median (min-max) of the rounds, us per span or log record\n")
    print("| what | SDK encoder + json_format, CPU | direct, CPU | SDK, wall | direct, wall | CPU ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in ("spans", "logs"):
        old_cpu, new_cpu = results[f"{name} sdk cpu"], results[f"{name} direct cpu"]
        ratio = statistics.median(old_cpu) / statistics.median(new_cpu)
        print(f"| {name} | {cell(old_cpu)} | {cell(new_cpu)} | {cell(results[f'{name} sdk wall'])} | "
              f"{cell(results[f'{name} direct wall'])} | {ratio:.0f}x |")
    print(f"\nJsonLinesSpanExporter.export (direct encoder, append, fsync per batch) into {tempfile.gettempdir()}: "
          f"{cell(export)} us per span, wall")


if __name__ == "__main__":
    main()
