"""OTLP sink for tests: a real OTLP/gRPC + OTLP/HTTP server that keeps what it receives.

In-process::

    with OtlpSink() as sink:
        exporter = OTLPSpanExporter(endpoint=sink.grpc_endpoint, insecure=True)
        ...
        assert sink.wait_for(lambda: len(sink.spans()) >= 1)
        resource_attrs, scope_name, span = sink.spans()[0]

Standalone (appends one OTLP/JSON line per request, hex ids, until SIGTERM/SIGINT)::

    python -m tests.support.otlp_sink --grpc 127.0.0.1:4317 --http 127.0.0.1:4318 --out FILE.jsonl

It prints ``otlp-sink grpc=PORT http=PORT`` on stdout once bound (useful with port 0).

The same extractors (:func:`spans_of`, :func:`metrics_of`) work on received requests and on
OTLP JSON-lines files (:func:`spans_from_jsonl`, :func:`metrics_from_jsonl`), as the OTel
Collector's file exporter writes them, so file and network output are asserted alike.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_ebpf.receivers.otlp.server import OtlpServer, OtlpServerStats, parse_otlp_json, to_otlp_json

__all__ = [
    "OtlpSink",
    "decode_attrs",
    "decode_value",
    "load_jsonl",
    "main",
    "metrics_from_jsonl",
    "metrics_of",
    "requests_from_jsonl",
    "spans_from_jsonl",
    "spans_of",
]

SpanRow = tuple[dict[str, Any], str, Any]  # (resource attributes, scope name, Span message)
MetricRow = tuple[dict[str, Any], Any]  # (resource attributes, Metric message)


def decode_value(value: Any) -> Any:
    """One OTLP ``AnyValue`` as a Python value (str/int/float/bool/bytes/list/dict/None)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [decode_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return decode_attrs(value.kvlist_value.values)
    return getattr(value, kind)


def decode_attrs(kv_list: Iterable[Any]) -> dict[str, Any]:
    """OTLP ``KeyValue`` list -> ``{key: python value}`` (later duplicates win)."""
    return {kv.key: decode_value(kv.value) for kv in kv_list}


def spans_of(requests: Iterable[Message]) -> list[SpanRow]:
    """(resource attrs, scope name, span) for every span in trace requests; others skipped."""
    rows: list[SpanRow] = []
    for request in requests:
        for resource_spans in getattr(request, "resource_spans", ()):
            attrs = decode_attrs(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                rows.extend((attrs, scope_spans.scope.name, span) for span in scope_spans.spans)
    return rows


def metrics_of(requests: Iterable[Message]) -> list[MetricRow]:
    """(resource attrs, metric) for every metric in metrics requests; others skipped."""
    rows: list[MetricRow] = []
    for request in requests:
        for resource_metrics in getattr(request, "resource_metrics", ()):
            attrs = decode_attrs(resource_metrics.resource.attributes)
            for scope_metrics in resource_metrics.scope_metrics:
                rows.extend((attrs, metric) for metric in scope_metrics.metrics)
    return rows


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every non-blank line of an OTLP JSON-lines file, decoded as a dict."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def requests_from_jsonl(path: str | Path) -> list[Message]:
    """Each line as the export request its top-level key names (resourceSpans/-Metrics/-Logs).

    Accepts OTLP/JSON (hex ids) as written by :func:`main` or the collector's file exporter;
    lines of another shape are skipped.
    """
    kinds: dict[str, type[Message]] = {
        "resourceSpans": ExportTraceServiceRequest,
        "resourceMetrics": ExportMetricsServiceRequest,
        "resourceLogs": ExportLogsServiceRequest,
    }
    out: list[Message] = []
    for line in load_jsonl(path):
        cls = next((c for key, c in kinds.items() if key in line), None)
        if cls is not None:
            out.append(parse_otlp_json(line, cls))
    return out


def spans_from_jsonl(path: str | Path) -> list[SpanRow]:
    """:func:`spans_of` over a JSON-lines file."""
    return spans_of(requests_from_jsonl(path))


def metrics_from_jsonl(path: str | Path) -> list[MetricRow]:
    """:func:`metrics_of` over a JSON-lines file."""
    return metrics_of(requests_from_jsonl(path))


class OtlpSink:
    """Test OTLP endpoint on free loopback ports, keeping the last ``max_requests`` requests.

    Thread safety: the server threads append; every accessor takes a snapshot under a lock,
    so tests may poll from any thread. Requests beyond ``max_requests`` push out the
    oldest, counted in ``dropped``. ``fail_with`` (settable any time) makes every callback
    raise it, to test exporters against a failing receiver. ``start``/``shutdown`` follow
    :class:`OtlpServer` (shutdown safe twice); the sink is also a context manager.
    """

    def __init__(self, *, max_requests: int = 10_000, max_request_bytes: int = 16 * 1024 * 1024) -> None:
        self._lock = threading.Lock()
        self._requests: deque[Message] = deque(maxlen=max_requests)
        self.dropped = 0
        self.fail_with: BaseException | None = None
        self.server = OtlpServer(grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0",
                                 on_traces=self._keep, on_metrics=self._keep, on_logs=self._keep,
                                 max_request_bytes=max_request_bytes)

    def _keep(self, request: Message) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        with self._lock:
            if len(self._requests) == self._requests.maxlen:
                self.dropped += 1
            self._requests.append(request)

    def start(self) -> OtlpSink:
        self.server.start()
        return self

    def shutdown(self) -> None:
        self.server.shutdown()

    def __enter__(self) -> OtlpSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def grpc_endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` for gRPC exporters (use ``insecure=True``)."""
        return f"http://127.0.0.1:{self.server.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """``http://127.0.0.1:PORT``; HTTP exporters need ``/v1/traces`` etc. appended."""
        return f"http://127.0.0.1:{self.server.http_port}"

    @property
    def stats(self) -> OtlpServerStats:
        return self.server.stats

    def requests(self) -> list[Message]:
        """Snapshot of the kept requests, oldest first."""
        with self._lock:
            return list(self._requests)

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()

    def spans(self) -> list[SpanRow]:
        return spans_of(self.requests())

    def metrics(self) -> list[MetricRow]:
        return metrics_of(self.requests())

    def metric_names(self) -> set[str]:
        return {metric.name for _, metric in self.metrics()}

    def wait_for(self, predicate: Callable[[], object], timeout: float = 10.0,
                 interval: float = 0.02) -> bool:
        """Poll ``predicate()`` until truthy (True) or ``timeout`` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)


def _file_writer(path: str) -> tuple[Callable[[Message], None], Callable[[], None]]:
    """A thread-safe appender of one OTLP/JSON line per request, flushed each time."""
    handle = open(path, "a", encoding="utf-8")  # closed by the returned closer
    lock = threading.Lock()

    def write(request: Message) -> None:
        line = to_otlp_json(request) + "\n"
        with lock:
            handle.write(line)
            handle.flush()

    def close() -> None:
        with lock:
            handle.close()

    return write, close


def main(argv: list[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT, appending received requests to ``--out`` as JSON lines."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.otlp_sink",
                                     description="OTLP sink for tests")
    parser.add_argument("--grpc", default="127.0.0.1:4317", help="gRPC HOST:PORT ('none' disables)")
    parser.add_argument("--http", default="127.0.0.1:4318", help="HTTP HOST:PORT ('none' disables)")
    parser.add_argument("--out", required=True, help="JSON-lines file to append to")
    args = parser.parse_args(argv)
    write, close = _file_writer(args.out)
    server = OtlpServer(grpc_endpoint=None if args.grpc == "none" else args.grpc,
                        http_endpoint=None if args.http == "none" else args.http,
                        on_traces=write, on_metrics=write, on_logs=write)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    print(f"otlp-sink grpc={server.grpc_port} http={server.http_port}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        close()
    print(f"otlp-sink stopped: {server.stats}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
