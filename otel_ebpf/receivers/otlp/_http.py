"""The OTLP/HTTP transport of :class:`receivers.otlp.server.OtlpServer`.

A stdlib ``ThreadingHTTPServer`` that serves POST ``/v1/traces``, ``/v1/metrics`` and
``/v1/logs`` (protobuf or JSON bodies, gzip/deflate) and hands each body to the owning server's
``_dispatch``, which decodes it, runs the callback and counts the outcome. Private to the
package: only ``server.py`` builds it.
"""
from __future__ import annotations

import binascii
import logging
import math
import socket
import threading
import zlib
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format
from google.rpc import status_pb2

from ._status import retry_status

if TYPE_CHECKING:
    from .server import OtlpServer, Signal

__all__: list[str] = []

log = logging.getLogger(__name__)
_MIB = 1024 * 1024
_HTTP_CODES = {"malformed": 400, "too_large": 413, "failed": 500, "refused": 503}


class _HttpServer(ThreadingHTTPServer):
    """Thread per connection, at most ``max_workers`` at once (a semaphore, not a queue)."""

    daemon_threads = True
    allow_reuse_port = False  # a taken port must fail, not be shared
    request_queue_size = 64  # the listen backlog is the only wait line

    def __init__(self, owner: OtlpServer, host: str, port: int, signals: Sequence[Signal]) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.owner = owner
        self.signals = tuple(signals)
        self.closing = threading.Event()
        self._slots = threading.BoundedSemaphore(owner._max_workers)
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        while not self._slots.acquire(timeout=0.2):
            if self.closing.is_set():
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(BaseHTTPRequestHandler):
    """One OTLP/HTTP request per connection (HTTP/1.0: idle keep-alives hold no slot)."""

    server: _HttpServer
    timeout = 30.0  # socket timeout: a stalled client cannot hold a worker for ever
    _DRAIN_LIMIT = 64 * _MIB

    def do_POST(self) -> None:
        owner = self.server.owner
        owner._counters.add("requests")
        signal = next((s for s in self.server.signals if s.path == self.path.split("?", 1)[0]), None)
        ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        is_json = ctype == "application/json"
        if signal is None or not owner._enabled(signal):
            return self._reject_unsupported(404, "no OTLP signal served at this path", is_json)
        if ctype not in ("application/json", "application/x-protobuf"):
            return self._reject_unsupported(415, f"unsupported Content-Type {ctype!r}", is_json)
        length_text = self.headers.get("Content-Length")
        if length_text is None or not length_text.isdigit():
            return self._reject_unsupported(411, "Content-Length required", is_json)
        length = int(length_text)
        if length > owner.max_request_bytes:
            owner._counters.add("rejected_too_large")
            self._drain(length)
            return self._reply(413, f"body of {length} bytes exceeds {owner.max_request_bytes}", is_json)
        body = self.rfile.read(length)
        try:
            raw = self._decode(body, owner.max_request_bytes)
        except LookupError as exc:
            return self._reject_unsupported(415, str(exc), is_json)
        except (zlib.error, EOFError, binascii.Error) as exc:
            owner._counters.add("rejected_malformed")
            return self._reply(400, f"cannot decompress body: {exc}", is_json)
        outcome, message = owner._dispatch(signal, raw, is_json=is_json)
        if outcome == "ok":
            ok = "{}" if is_json else signal.response_cls().SerializeToString()
            return self._send(200, ok.encode() if isinstance(ok, str) else ok, ctype)
        if outcome == "refused":  # OTLP/HTTP "Throttling": 503 + Retry-After, RetryInfo in the body
            error = retry_status(message, owner.retry_after)
            # RFC 9110 10.2.3: delay-seconds is a whole number; round up so the hint is never shortened
            retry = str(max(1, math.ceil(owner.retry_after)))
            return self._status(503, error, is_json, (("Retry-After", retry),))
        return self._reply(_HTTP_CODES[outcome], message, is_json)

    def do_GET(self) -> None:
        self.server.owner._counters.add("rejected_unsupported")
        self._reply(405, "OTLP/HTTP accepts POST only", False)

    def _decode(self, body: bytes, limit: int) -> bytes:
        """Undo Content-Encoding, producing at most ``limit + 1`` bytes (bomb-safe)."""
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding == "identity":
            return body
        if encoding not in ("gzip", "deflate", "x-gzip"):
            raise LookupError(f"unsupported Content-Encoding {encoding!r}")
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)  # auto-detects gzip or zlib header
        raw = inflater.decompress(body, limit + 1)
        if not inflater.eof and len(raw) <= limit:
            raise EOFError("truncated compressed body")
        return raw  # over the limit: _dispatch rejects it as too large

    def _drain(self, length: int) -> None:
        """Read and drop a body we refuse, so the client sees our status, not a reset."""
        left = min(length, self._DRAIN_LIMIT)
        while left > 0:
            chunk = self.rfile.read(min(left, _MIB))
            if not chunk:
                break
            left -= len(chunk)

    def _reject_unsupported(self, status: int, message: str, is_json: bool) -> None:
        self.server.owner._counters.add("rejected_unsupported")
        self._reply(status, message, is_json)

    def _reply(self, status: int, message: str, is_json: bool) -> None:
        grpc_code = {400: 3, 404: 12, 405: 12, 411: 3, 413: 8, 415: 3}.get(status, 13)
        self._status(status, status_pb2.Status(code=grpc_code, message=message), is_json)

    def _status(self, status: int, error: status_pb2.Status, is_json: bool,
                headers: Sequence[tuple[str, str]] = ()) -> None:
        if is_json:
            self._send(status, json_format.MessageToJson(error, indent=None).encode(), "application/json", headers)
        else:
            self._send(status, error.SerializeToString(), "application/x-protobuf", headers)

    def _send(self, status: int, body: bytes, ctype: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("otlp-http %s: " + format, self.address_string(), *args)
