"""Cost per span of exporting spans over OTLP/gRPC and OTLP/HTTP: ``.venv/bin/python bench/otlp_export.py``.

Two exporters send the same batches of SDK spans to a null collector in another process (a raw
gRPC TraceService and an HTTP ``/v1/traces`` handler that count the bytes and answer OK, so the
receiving end costs this process nothing):

* ``sdk``: the SDK's ``OTLPSpanExporter`` (what the agent used before issue 19): its OTLP
  encoder, then protobuf's serializer;
* ``direct``: ``otel_ebpf.emit.otlp_direct`` (what it uses now): the same exporter sending the
  bytes ``otel_ebpf.emit.otlp_proto.spans_to_otlp_proto`` writes.

A first table times the encoding alone (``encode_spans(b).SerializeToString()`` against
``spans_to_otlp_proto(b)``, and the same for log records), checking every round that both wrote
the same bytes. The second times whole ``export`` calls in this process's CPU time (every
thread: gRPC's own included) per span, per protocol, with and without gzip. The spans, logs,
batches of 512 and the interleaved rounds (A, B, A, B, ...) are bench/file_export.py's; each
figure is the median of the rounds with their range. Prints Markdown; every figure comes from
this run.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from file_export import BATCH, batches, cell, make_logs, make_spans, run_pair, workload_parser  # noqa: E402


def serve(count_spans: bool = False) -> None:
    """The null collector: prints "grpc=PORT http=PORT", then answers OK until stdin closes. With
    ``count_spans`` it parses each trace request (protobuf's C parser, in this process) and a
    GET on the HTTP port answers the number of spans received so far."""
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    received = [0, 0]  # bytes, spans
    lock = threading.Lock()

    def count(body: bytes) -> None:
        n = 0
        if count_spans:
            request = ExportTraceServiceRequest.FromString(body)
            n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with lock:
            received[0] += len(body)
            received[1] += n

    def export(body: bytes, context: Any) -> bytes:
        count(body)
        return b""

    def ack(body: bytes, context: Any) -> bytes:
        return b""

    handlers = [grpc.method_handlers_generic_handler(f"opentelemetry.proto.collector.{service}", {
        "Export": grpc.unary_unary_rpc_method_handler(fn, request_deserializer=None, response_serializer=None)})
        for service, fn in (("trace.v1.TraceService", export), ("metrics.v1.MetricsService", ack),
                            ("logs.v1.LogsService", ack))]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(handlers)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    class Http(BaseHTTPRequestHandler):
        def _answer(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/v1/traces":
                count(body)
            self._answer(b"", "application/x-protobuf")

        def do_GET(self) -> None:  # http.server's name
            self._answer(str(received[1]).encode(), "text/plain")

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Http)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    print(f"grpc={port} http={http.server_address[1]}", flush=True)
    sys.stdin.read()
    print(f"null collector: {received[0]} bytes, {received[1]} spans counted", file=sys.stderr)


def exporters(grpc_port: int, http_port: int) -> dict[str, tuple[Any, Any]]:
    """(sdk, direct) exporter pairs per transport."""
    from grpc import Compression
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSdk
    from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSdk

    from otel_ebpf.emit.otlp_direct import DirectGrpcSpanExporter, DirectHttpSpanExporter

    grpc_args = {"endpoint": f"127.0.0.1:{grpc_port}", "insecure": True}
    http_url = f"http://127.0.0.1:{http_port}/v1/traces"
    return {
        "gRPC": (GrpcSdk(**grpc_args), DirectGrpcSpanExporter(**grpc_args)),
        "gRPC gzip": (GrpcSdk(**grpc_args, compression=Compression.Gzip),
                      DirectGrpcSpanExporter(**grpc_args, compression=Compression.Gzip)),
        "HTTP": (HttpSdk(endpoint=http_url), DirectHttpSpanExporter(endpoint=http_url)),
        "HTTP gzip": (HttpSdk(endpoint=http_url, compression=HttpCompression.Gzip),
                      DirectHttpSpanExporter(endpoint=http_url, compression=HttpCompression.Gzip)),
    }


def export_rounds(pair: tuple[Any, Any], parts: list[Sequence[Any]], n: int, rounds: int) -> dict[str, list[float]]:
    """Process CPU us per span of exporting every batch, per round, sdk and direct interleaved."""
    out: dict[str, list[float]] = {"sdk": [], "direct": []}
    for r in range(rounds):
        order = [("sdk", pair[0]), ("direct", pair[1])] if r % 2 == 0 else [("direct", pair[1]), ("sdk", pair[0])]
        for mode, exporter in order:
            cpu0 = time.process_time_ns()
            for part in parts:
                if exporter.export(part).name != "SUCCESS":
                    sys.exit(f"bench: {mode} export failed")
            out[mode].append((time.process_time_ns() - cpu0) / n / 1e3)
    return out


def encode_table(spans: list[Any], logs: list[Any], rounds: int) -> None:
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_ebpf.emit.otlp_native import NATIVE
    from otel_ebpf.emit.otlp_proto import logs_to_otlp_proto, python_spans_to_otlp_proto, spans_to_otlp_proto

    sdk_spans: Callable[[Sequence[Any]], Any] = lambda b: encode_spans(b).SerializeToString()  # noqa: E731
    sdk_logs: Callable[[Sequence[Any]], Any] = lambda b: encode_logs(b).SerializeToString()  # noqa: E731
    results = run_pair("spans", len(spans), batches(spans), sdk_spans, spans_to_otlp_proto, rounds)
    results |= run_pair("logs", len(logs), batches(logs), sdk_logs, logs_to_otlp_proto, rounds)
    # the C extension (spans_to_otlp_proto's first try) against the Python writer it falls back to
    results |= run_pair("spans, C", len(spans), batches(spans), python_spans_to_otlp_proto, spans_to_otlp_proto,
                        rounds)
    print(f"| encoding | SDK encoder + SerializeToString, CPU | direct{' (C for spans)' if NATIVE else ''}, CPU "
          "| CPU ratio |")
    print("|---|---:|---:|---:|")
    for name in ("spans", "logs"):
        old, new = results[f"{name} sdk cpu"], results[f"{name} direct cpu"]
        print(f"| {name} | {cell(old)} | {cell(new)} | {statistics.median(old) / statistics.median(new):.1f}x |")
    old, new = results["spans, C sdk cpu"], results["spans, C direct cpu"]
    print(f"| spans: the direct writer in Python, then {'C' if NATIVE else 'C (not built: Python again)'} | "
          f"{cell(old)} | {cell(new)} | {statistics.median(old) / statistics.median(new):.1f}x |")


def main(argv: list[str] | None = None) -> None:
    ap = workload_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--count-spans", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return serve(args.count_spans)
    from otel_ebpf.emit.otlp_proto import spans_to_otlp_proto

    spans, logs = make_spans(args.spans, args.resources), make_logs(args.logs, args.resources)
    size = len(spans_to_otlp_proto(spans[:BATCH])) / BATCH
    print(f"\n{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average "
          f"{os.getloadavg()[0]:.1f}; {len(spans)} spans ({size:.0f} bytes each on the wire), {len(logs)} log "
          f"records, {args.resources} resources, batches of {BATCH}, {args.rounds} interleaved rounds; "
          "median (min-max) of the rounds, us per span or log record\n")
    encode_table(spans, logs, args.rounds)
    collector = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
    try:
        assert collector.stdout is not None
        ports = dict(kv.split("=") for kv in collector.stdout.readline().split())
        print("\n| export to a null collector (process CPU, all threads) | SDK exporter | direct | CPU ratio |")
        print("|---|---:|---:|---:|")
        for name, pair in exporters(int(ports["grpc"]), int(ports["http"])).items():
            got = export_rounds(pair, batches(spans), len(spans), args.rounds)
            ratio = statistics.median(got["sdk"]) / statistics.median(got["direct"])
            print(f"| {name} | {cell(got['sdk'])} | {cell(got['direct'])} | {ratio:.1f}x |", flush=True)
            for exporter in pair:
                exporter.shutdown()
    finally:
        if collector.stdin is not None:
            collector.stdin.close()
        collector.wait(timeout=10)


if __name__ == "__main__":
    main()
