"""OTLP receiver: gRPC and HTTP servers on the official opentelemetry-proto messages.

``OtlpServer`` accepts OTLP exports over gRPC (grpcio) and OTLP/HTTP (stdlib
``ThreadingHTTPServer``: POST ``/v1/traces``, ``/v1/metrics``, ``/v1/logs``;
``application/x-protobuf`` or ``application/json``; ``gzip``/``deflate`` encoding) and hands
each decoded ``Export*ServiceRequest`` to a callback. With ``decode_traces``, the protobuf bytes of each trace
request go first to it; what it makes of them (a :class:`Decoded`) is handed over instead, unparsed, and None has
the request parsed and handed over as usual (the gateway's C span decoder: it returns None for anything it does not
decode, malformed bytes included, so what the parse rejects is still rejected here).

Security: both servers bind **loopback (127.0.0.1) by default**, plaintext and without auth.
Another address is used only when passed explicitly; nothing defaults to ``0.0.0.0``.

Outcomes, counted in :attr:`OtlpServer.stats` (gRPC status / HTTP status):

- accepted: ``OK`` / 200 with an empty response (partial success left empty);
- malformed protobuf, JSON or compression: ``INVALID_ARGUMENT`` / 400 (``rejected_malformed``);
- over ``max_request_bytes`` once decompressed: ``RESOURCE_EXHAUSTED`` / 413
  (``rejected_too_large``); grpcio itself refuses messages over twice that, uncounted;
- callback raised: ``INTERNAL`` / 500 (``callback_errors``); serving goes on;
- callback refused it (returned ``False``: no room downstream, nothing of the request kept):
  ``UNAVAILABLE`` / 503 (``refused``) with a retry hint of ``retry_after`` seconds, so the
  client retries the whole request later (OTLP spec, "Failures" / "Throttling"): gRPC carries a
  ``google.rpc.RetryInfo`` in the status details (``grpc-status-details-bin``) and, because
  opentelemetry-exporter-otlp-proto-grpc 1.45 reads only that trailer, also as
  ``google.rpc.retryinfo-bin``; HTTP sends ``Retry-After: <whole seconds>`` (which the
  opentelemetry-exporter-otlp-proto-http 1.45 client honours) and the same Status body;
- no callback for the signal: ``UNIMPLEMENTED`` / 404; wrong HTTP path, method, media type
  or encoding: 404/405/411/415 (``rejected_unsupported``).

Bounds: gRPC runs ``max_workers`` threads and refuses more than ``4 * max_workers``
concurrent RPCs (``RESOURCE_EXHAUSTED``, counted by grpcio only); HTTP runs at most
``max_workers`` handlers, further connections wait in the kernel listen backlog. No queue: a
callback that has no room refuses (above) rather than queueing or dropping.

Errors: :class:`OtlpBindError` (an ``otel_ebpf.core.errors.EnvironmentError_``) when an endpoint
cannot be bound; ``otel_ebpf.core.errors.ConfigError`` for a bad endpoint or limit.

Layout: the OTLP/JSON codec is :mod:`receivers.otlp.otlp_json` (``parse_otlp_json`` and
``to_otlp_json`` are re-exported here), the HTTP transport :mod:`receivers.otlp._http`, the
refusal status both transports send :mod:`receivers.otlp._status`.
"""
from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any, Protocol

import grpc
from google.protobuf import json_format
from google.protobuf.message import Error as ProtobufError
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_pb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb

from otel_ebpf.core.errors import ConfigError, EnvironmentError_
from ._http import _HttpServer
from ._status import retry_status
from otel_ebpf.core.otlpjson import parse_otlp_json, to_otlp_json

__all__ = [
    "SIGNALS",
    "Decoded",
    "OtlpBindError",
    "OtlpServer",
    "OtlpServerStats",
    "Signal",
    "count_items",
    "parse_endpoint",
    "parse_otlp_json",
    "received_bytes",
    "to_otlp_json",
]

log = logging.getLogger(__name__)
_MIB = 1024 * 1024
_BIND_HINT = "another process (a collector?) may hold the port; pick another, or port 0 for any free one"


_RECEIVED = threading.local()  # (request, the protobuf bytes it was parsed from) while its callback runs


def received_bytes(request: Message) -> bytes | None:
    """The protobuf bytes ``request`` was parsed from, while the server's callback for it runs on this thread; None
    for a request given as JSON, another object, or after the callback. The gateway's ingest decodes spans from
    them instead of serializing the parsed request again (~0.8 us a span, bench/gateway_wire.py under py-spy)."""
    got = getattr(_RECEIVED, "pair", None)
    return got[1] if got is not None and got[0] is request else None


class Decoded(Protocol):
    """What an ``OtlpServer``'s ``decode_traces`` makes of a request's protobuf bytes, handed to ``on_traces`` in
    place of the parsed request: ``items``, the spans the request carried (its server counts them received)."""

    items: int


class OtlpBindError(EnvironmentError_):
    """An OTLP server could not bind its endpoint (port taken, address not local, ...)."""


@dataclass(frozen=True)
class Signal:
    """One OTLP signal: its name, HTTP path, gRPC service and messages."""

    name: str
    path: str
    service: str
    request_cls: type[Message]
    response_cls: type[Message]
    item_counter: str


SIGNALS = (
    Signal("traces", "/v1/traces", trace_pb.DESCRIPTOR.services_by_name["TraceService"].full_name,
           trace_pb.ExportTraceServiceRequest, trace_pb.ExportTraceServiceResponse, "spans"),
    Signal("metrics", "/v1/metrics", metrics_pb.DESCRIPTOR.services_by_name["MetricsService"].full_name,
           metrics_pb.ExportMetricsServiceRequest, metrics_pb.ExportMetricsServiceResponse,
           "metric_points"),
    Signal("logs", "/v1/logs", logs_pb.DESCRIPTOR.services_by_name["LogsService"].full_name,
           logs_pb.ExportLogsServiceRequest, logs_pb.ExportLogsServiceResponse, "log_records"),
)


def count_items(request: Message) -> int:
    """Spans, metric data points or log records in one export request."""
    n = 0
    for resource in getattr(request, "resource_spans", ()):
        n += sum(len(scope.spans) for scope in resource.scope_spans)
    for resource in getattr(request, "resource_logs", ()):
        n += sum(len(scope.log_records) for scope in resource.scope_logs)
    for resource in getattr(request, "resource_metrics", ()):
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                n += len(getattr(metric, kind).data_points) if kind else 0
    return n


def _parse(signal: Signal, raw: bytes, *, is_json: bool) -> Message:
    if is_json:
        return parse_otlp_json(raw, signal.request_cls)
    request = signal.request_cls()
    request.ParseFromString(raw)
    return request


# -- counters ---------------------------------------------------------------------------
@dataclass(frozen=True)
class OtlpServerStats:
    """Snapshot of the server counters; every field is a plain ``int``."""

    requests: int = 0
    spans: int = 0
    metric_points: int = 0
    log_records: int = 0
    rejected_malformed: int = 0
    rejected_too_large: int = 0
    rejected_unsupported: int = 0
    callback_errors: int = 0
    refused: int = 0


class _Counters:
    """Lock-protected counters shared by all server threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = {f.name: 0 for f in fields(OtlpServerStats)}

    def add(self, name: str, n: int = 1) -> int:
        with self._lock:
            self._values[name] += n
            return self._values[name]

    def snapshot(self) -> OtlpServerStats:
        with self._lock:
            return OtlpServerStats(**self._values)


def parse_endpoint(endpoint: str, *, what: str = "endpoint") -> tuple[str, int]:
    """Split ``"host:port"`` (``"[::1]:4317"`` and ``"http://host:port"`` also accepted).

    An empty host (``":0"``) means 127.0.0.1; port 0 asks the OS for a free port.
    Raises :class:`ConfigError` naming ``what`` when the text is not an endpoint.
    """
    text = endpoint.strip().split("://", 1)[-1].rstrip("/")
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(what, f"{endpoint!r} is not HOST:PORT", hint="e.g. 127.0.0.1:4317, or :0")
    return host.strip("[]") or "127.0.0.1", int(port_text)


def _why_unbindable(host: str, port: int) -> str:
    """Best-effort reason a bind fails (grpcio only says 'Failed to bind')."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    except OSError as exc:
        return exc.strerror or str(exc)
    return "unknown reason"


_GRPC_CODES = {"malformed": grpc.StatusCode.INVALID_ARGUMENT,
               "too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,
               "failed": grpc.StatusCode.INTERNAL,
               "refused": grpc.StatusCode.UNAVAILABLE}


class OtlpServer:
    """OTLP/gRPC + OTLP/HTTP receiver handing decoded requests to callbacks.

    Callbacks run on server worker threads, several at once, so they must be thread safe;
    they should return quickly: a slow callback holds a worker and so throttles clients.
    A callback returns ``None`` (or ``True``) when it took the request, ``False`` when it
    refused it whole for lack of room (then it must keep nothing of it): the client is told
    to retry after ``retry_after`` seconds. The callback owns the request it gets.
    An endpoint of ``None`` disables that transport. ``start`` binds both or raises
    :class:`OtlpBindError` naming the endpoint; ``shutdown`` is safe without ``start`` and
    safe twice. ``stats``, ``grpc_port`` and ``http_port`` may be read from any thread.
    """

    def __init__(
        self,
        *,
        grpc_endpoint: str | None = "127.0.0.1:4317",
        http_endpoint: str | None = "127.0.0.1:4318",
        on_traces: Callable[[trace_pb.ExportTraceServiceRequest], bool | None],
        on_metrics: Callable[[metrics_pb.ExportMetricsServiceRequest], bool | None] | None = None,
        on_logs: Callable[..., bool | None] | None = None,
        max_request_bytes: int = 16 * _MIB,
        max_workers: int = 8,
        retry_after: float = 1.0,
        decode_traces: Callable[[bytes], Decoded | None] | None = None,
    ) -> None:
        if max_request_bytes <= 0 or max_workers <= 0:
            raise ConfigError("otlp", "max_request_bytes and max_workers must be positive")
        if not 0 < retry_after <= 3600:
            raise ConfigError("otlp.retry_after", f"must be in (0, 3600] seconds, got {retry_after}")
        self.retry_after = retry_after
        self._grpc_addr = parse_endpoint(grpc_endpoint, what="grpc_endpoint") if grpc_endpoint else None
        self._http_addr = parse_endpoint(http_endpoint, what="http_endpoint") if http_endpoint else None
        self._callbacks: dict[str, Callable[[Any], bool | None] | None] = {
            "traces": on_traces, "metrics": on_metrics, "logs": on_logs}
        self._decode_traces = decode_traces
        self.max_request_bytes = max_request_bytes
        self._max_workers = max_workers
        self._counters = _Counters()
        self._lock = threading.Lock()
        self._state = "new"
        self._grpc: grpc.Server | None = None
        self._grpc_port = 0
        self._http: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None

    @property
    def stats(self) -> OtlpServerStats:
        """A consistent snapshot of the counters."""
        return self._counters.snapshot()

    @property
    def grpc_port(self) -> int:
        """The bound gRPC port; 0 before ``start`` or when gRPC is disabled."""
        return self._grpc_port

    @property
    def http_port(self) -> int:
        """The bound HTTP port; 0 before ``start`` or when HTTP is disabled."""
        return self._http.server_address[1] if self._http else 0

    def start(self) -> None:
        """Bind and serve in background threads; returns once both ports are bound."""
        with self._lock:
            if self._state != "new":
                raise RuntimeError(f"OtlpServer.start() called in state {self._state!r}")
            self._state = "started"
            try:
                if self._grpc_addr:
                    self._start_grpc(*self._grpc_addr)
                if self._http_addr:
                    self._start_http(*self._http_addr)
            except BaseException:
                self._stop_locked()
                raise

    def shutdown(self) -> None:
        """Stop both servers (1 s grace for in-flight RPCs). Idempotent; blocks < ~6 s."""
        with self._lock:
            self._stop_locked()

    def __enter__(self) -> OtlpServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- the one request path both transports share -----------------------------------
    def _enabled(self, signal: Signal) -> bool:
        return self._callbacks[signal.name] is not None

    def _dispatch(self, signal: Signal, raw: bytes, *, is_json: bool) -> tuple[str, str]:
        """Decode ``raw`` and run the callback; returns (outcome, message). Never raises."""
        if len(raw) > self.max_request_bytes:
            self._counters.add("rejected_too_large")
            return "too_large", f"request of {len(raw)} bytes exceeds {self.max_request_bytes}"
        decoded = self._decode_traces(raw) if self._decode_traces is not None and signal.name == "traces" \
            and not is_json else None
        if decoded is not None:
            return self._hand_over(signal, decoded, decoded.items)
        try:
            request = _parse(signal, raw, is_json=is_json)
        # protobuf 7: DecodeError and json_format.ParseError derive from Exception, not ValueError
        except (ProtobufError, json_format.Error, ValueError, RecursionError) as exc:
            self._counters.add("rejected_malformed")
            return "malformed", f"cannot decode {signal.name} request: {exc}"
        _RECEIVED.pair = None if is_json else (request, raw)
        try:
            return self._hand_over(signal, request, None)
        finally:
            _RECEIVED.pair = None

    def _hand_over(self, signal: Signal, request: Any, items: int | None) -> tuple[str, str]:
        """Run the callback on ``request`` (parsed, or what ``decode_traces`` made of it: ``items`` spans)."""
        callback = self._callbacks[signal.name]
        if callback is None:  # the transports check _enabled() first; belt and braces
            return "failed", f"no consumer for {signal.name}"
        try:
            taken = callback(request)
        except Exception as exc:
            errors = self._counters.add("callback_errors")
            if errors == 1 or errors % 1000 == 0:
                log.warning("OTLP %s callback raised (%d so far)", signal.name, errors, exc_info=exc)
            return "failed", f"{signal.name} consumer failed: {type(exc).__name__}"
        if taken is False:
            self._counters.add("refused")
            return "refused", f"{signal.name} consumer is full: retry in {self.retry_after:g}s"
        self._counters.add(signal.item_counter, count_items(request) if items is None else items)
        return "ok", ""

    # -- gRPC -------------------------------------------------------------------------
    def _start_grpc(self, host: str, port: int) -> None:
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="otlp-grpc"),
            maximum_concurrent_rpcs=4 * self._max_workers,
            options=[("grpc.max_receive_message_length", 2 * self.max_request_bytes),
                     ("grpc.so_reuseport", 0)])  # else a second server silently shares the port
        for signal in SIGNALS:
            if self._enabled(signal):
                handler = grpc.unary_unary_rpc_method_handler(self._grpc_method(signal))
                server.add_generic_rpc_handlers(
                    (grpc.method_handlers_generic_handler(signal.service, {"Export": handler}),))
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(addr)
        except RuntimeError:  # grpcio >= 1.5x raises "Failed to bind" instead of returning 0
            bound = 0
        if not bound:
            server.stop(None)
            raise OtlpBindError(f"cannot bind OTLP gRPC server to {addr}: {_why_unbindable(host, port)}",
                                hint=_BIND_HINT)
        server.start()
        self._grpc, self._grpc_port = server, bound

    def _grpc_method(self, signal: Signal) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        # Raw bytes in (no request_deserializer, unlike the generated add_*Servicer_to_server)
        # so malformed protobuf is a counted INVALID_ARGUMENT, not grpcio's uncounted
        # "Exception deserializing request!" (StatusCode.INTERNAL).
        empty_response: bytes = signal.response_cls().SerializeToString()

        def export(raw: bytes, context: grpc.ServicerContext) -> bytes:
            self._counters.add("requests")
            outcome, message = self._dispatch(signal, raw, is_json=False)
            if outcome == "refused":
                status = retry_status(message, self.retry_after)
                context.set_trailing_metadata((
                    ("grpc-status-details-bin", status.SerializeToString()),
                    ("google.rpc.retryinfo-bin", status.details[0].value)))
            if outcome != "ok":
                context.abort(_GRPC_CODES[outcome], message)  # raises
            return empty_response

        return export

    # -- HTTP -------------------------------------------------------------------------
    def _start_http(self, host: str, port: int) -> None:
        try:
            self._http = _HttpServer(self, host, port, SIGNALS)
        except OSError as exc:
            raise OtlpBindError(f"cannot bind OTLP HTTP server to {host}:{port}: {exc.strerror or exc}",
                                hint=_BIND_HINT) from exc
        self._http_thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.2},
                                             name="otlp-http", daemon=True)
        self._http_thread.start()

    def _stop_locked(self) -> None:
        if self._state == "stopped":
            return
        self._state = "stopped"
        if self._grpc is not None:
            self._grpc.stop(grace=1.0).wait(timeout=5.0)
            self._grpc = None
        if self._http is not None:
            self._http.closing.set()
            if self._http_thread is not None:
                self._http.shutdown()  # only valid while serve_forever runs
                self._http_thread.join(timeout=5.0)
            self._http.server_close()
