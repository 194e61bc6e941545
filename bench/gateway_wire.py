"""The gateway end to end over real gRPC: OTLP in -> collective_join -> OTLP out, rank spans/s and memory.

    .venv/bin/python bench/gateway_wire.py [--ranks 1024] [--collectives 100] [--rounds 3]

Three processes on this machine: a sender, the gateway (``otel-ebpf gateway``, default config but
for a 60 s join timeout), and a null collector (bench/otlp_export.py's, counting the spans it
gets). The rank spans are bench/gateway.py's (``--ranks`` ranks x ``--collectives`` all-reduces,
8 ranks per host resource), encoded into OTLP requests of ``--batch`` spans before anything is
timed, and sent by ``--senders`` threads as the agents' exporters would (a refusal,
RESOURCE_EXHAUSTED or UNAVAILABLE, is retried after 50 ms and counted). Timed per scenario: from
the first request sent to the last joined span counted at the null collector (every rank span
plus one root per collective). Reported: rank spans/s through the whole path, the rate the collector counted
spans at between 10 % and 90 % of them (its count read every 20 ms: the run without its ends, of
which the last partial batch waits the gateway exporter's ``batch_delay``, 0.2 s, once a run), the
gateway's CPU (user + system) per rank span, and its RSS (after start, peak sampled every 50 ms, at the end).
Scenarios as bench/gateway.py: ``in order`` and ``interleaved`` (8 collectives in flight).
A fresh gateway per round; the median round and the range are printed as Markdown.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gateway import arrival, build  # noqa: E402

_TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_COUNT_EVERY_S = 0.02  # how often the null collector's count is read for the steady rate


class Collector:
    """bench/otlp_export.py --serve --count-spans in its own process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "otlp_export.py"), "--serve",
                                      "--count-spans"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        ports = dict(kv.split("=") for kv in self.proc.stdout.readline().split())
        self.grpc, self.http = int(ports["grpc"]), int(ports["http"])

    def spans(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/", timeout=5) as r:
            return int(r.read())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


def start_gateway(collector: Collector, workdir: Path) -> tuple[subprocess.Popen, int]:
    cfg = workdir / "gateway.yaml"
    cfg.write_text("processors:\n  collective_join: {timeout: 60s}\n")
    cfg.chmod(0o600)
    proc = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "gateway", "--config", str(cfg),
                             "--grpc-endpoint", "127.0.0.1:0", "--http-endpoint", "",
                             "--otlp-endpoint", f"127.0.0.1:{collector.grpc}", "--otlp-protocol", "grpc"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=open(workdir / "gateway.stderr", "w"),
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"grpc=(\d+)", line)
    if not m:
        proc.kill()
        sys.exit(f"bench: the gateway did not start: {line!r} {(workdir / 'gateway.stderr').read_text()[-2000:]}")
    return proc, int(m.group(1))


def send_all(port: int, requests: list[bytes], senders: int) -> int:
    """Every request sent (refusals retried); returns the refusals."""
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(_TRACES, request_serializer=None, response_deserializer=None)
    refused = [0]
    lock = threading.Lock()
    todo = list(reversed(requests))

    def work() -> None:
        while True:
            with lock:
                if not todo:
                    return
                body = todo.pop()
            while True:
                try:
                    call(body, timeout=30)
                    break
                except grpc.RpcError as exc:
                    if exc.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                        raise
                    with lock:
                        refused[0] += 1
                    time.sleep(0.05)

    threads = [threading.Thread(target=work) for _ in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    channel.close()
    return refused[0]


def one_round(requests: list[bytes], rank_spans: int, expected: int, senders: int, workdir: Path) -> dict[str, float]:
    collector = Collector()
    gateway, port = start_gateway(collector, workdir)
    try:
        ps = psutil.Process(gateway.pid)
        time.sleep(1.0)  # settled after start
        rss0 = ps.memory_info().rss
        cpu0 = ps.cpu_times()
        peak = [rss0]
        done = threading.Event()

        counted: list[tuple[float, int]] = []  # (perf_counter, spans the collector had counted)

        def sample() -> None:
            while not done.wait(0.05):
                peak[0] = max(peak[0], ps.memory_info().rss)

        def count() -> None:
            while not done.wait(_COUNT_EVERY_S):
                counted.append((time.perf_counter(), collector.spans()))

        sampler = threading.Thread(target=sample, daemon=True)
        counter = threading.Thread(target=count, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        counter.start()
        refused = send_all(port, requests, senders)
        deadline = time.monotonic() + 300
        while collector.spans() < expected and time.monotonic() < deadline:
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        got = collector.spans()
        cpu1 = ps.cpu_times()
        done.set()
        sampler.join()
        counter.join()
        rss1 = ps.memory_info().rss
    finally:
        gateway.terminate()
        gateway.wait(timeout=60)
        collector.close()
    if got < expected:
        sys.exit(f"bench: the null collector counted {got} of {expected} spans in 300 s")
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {"rate": rank_spans / wall, "steady": steady_rate(counted, expected), "cpu_us": cpu / rank_spans * 1e6,
            "rss0": rss0 / 2**20, "peak": peak[0] / 2**20, "rss1": rss1 / 2**20, "refused": refused, "wall": wall}


def steady_rate(counted: Sequence[tuple[float, int]], expected: int) -> float:
    """Spans a second the collector counted between its first count past 10 % of ``expected`` and its first past
    90 %: the rate without the run's ends (the first requests; the last partial batch, which waits for the
    exporter's batch_delay, 0.2 s); nan when the counts are too few to tell."""
    lo = next(((t, n) for t, n in counted if n >= 0.1 * expected), None)
    hi = next(((t, n) for t, n in counted if n >= 0.9 * expected), None)
    if lo is None or hi is None or hi[0] <= lo[0]:
        return float("nan")
    return (hi[1] - lo[1]) / (hi[0] - lo[0])


def encode(spans: Sequence[Any], batch: int) -> list[bytes]:
    from otel_ebpf.emit.otlp_proto import spans_to_otlp_proto

    return [spans_to_otlp_proto(spans[i:i + batch]) for i in range(0, len(spans), batch)]


def cell(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--collectives", type=int, default=100)
    p.add_argument("--batch", type=int, default=512, help="rank spans per OTLP request")
    p.add_argument("--senders", type=int, default=2, help="sending threads (agents' exporters)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", choices=("in-order", "interleaved"), help="run one scenario (e.g. under a profiler)")
    args = p.parse_args(argv)
    rows = build(args.ranks, args.collectives)
    scenarios = {"in order": [s for r in rows for s in r], "interleaved (8 in flight)": arrival(rows, 8)}
    if args.only:
        name = {"in-order": "in order", "interleaved": "interleaved (8 in flight)"}[args.only]
        scenarios = {name: scenarios[name]}
    rank_spans = args.ranks * args.collectives
    expected = rank_spans + args.collectives
    results: dict[str, list[dict[str, float]]] = {name: [] for name in scenarios}
    encoded = {name: encode(spans, args.batch) for name, spans in scenarios.items()}
    del rows, scenarios
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / "otel-ebpf-gateway-wire"
    workdir.mkdir(exist_ok=True)
    for r in range(args.rounds):
        for name, requests in encoded.items():
            results[name].append(one_round(requests, rank_spans, expected, args.senders, workdir))
            got = results[name][-1]
            print(f"round {r + 1}/{args.rounds} {name}: {got['rate']:.0f} rank spans/s ({got['steady']:.0f} steady), "
                  f"{got['cpu_us']:.1f} us "
                  f"gateway CPU each, RSS peak {got['peak']:.0f} MiB, {got['refused']:.0f} refusals",
                  file=sys.stderr, flush=True)
    print(f"\n{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
          f"{os.getloadavg()[0]:.1f}; {args.ranks} ranks x {args.collectives} collectives = {rank_spans} rank spans "
          f"({expected} spans out), requests of {args.batch}, {args.senders} senders, {args.rounds} rounds, a fresh "
          "gateway each; median (min-max)\n")
    print("| scenario | rank spans/s, gRPC in to gRPC out | spans/s steady (10-90 %) | gateway CPU per rank span | "
          "gateway RSS after start | RSS peak | RSS at the end | refusals retried |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        col = {k: [run[k] for run in runs] for k in runs[0]}
        print(f"| {name} | {cell(col['rate'], ',.0f')} | {cell(col['steady'], ',.0f')} | "
              f"{cell(col['cpu_us'], '.1f')} us | "
              f"{cell(col['rss0'], '.0f')} MiB | {cell(col['peak'], '.0f')} MiB | {cell(col['rss1'], '.0f')} MiB | "
              f"{cell(col['refused'], '.0f')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
