"""The SDK's OTLP span and log exporters, sending request bytes from :mod:`.otlp_proto`.

Everything but the encoding stays the SDK's (opentelemetry-exporter-otlp-proto-grpc/-http 1.45):
the channel or session, TLS, headers, compression, the timeout, and the OTLP retry semantics
(retryable codes, ``RetryInfo``/``Retry-After``, jittered backoff, the gRPC reconnect on
UNAVAILABLE), and the exporters' own metrics. What changes:

* gRPC: ``_translate_data`` returns the bytes :func:`.otlp_proto.spans_to_otlp_proto` writes
  (encoded once per batch, not once per retry as the SDK does), and the stub is one raw
  ``unary_unary`` call on the SDK's channel to the same method, sending them as they are;
* HTTP: ``export`` posts the same bytes through the SDK's transport, with the SDK's size limit.

The bytes are the ones the SDK would send (tests/unit/emit/test_otlp_proto.py); a batch the
direct encoder cannot write exactly is encoded the SDK's way, counted in ``fallbacks`` and said
once in the log. Costs: ``bench/otlp_export.py``, docs/benchmarks.md.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http._common import RequestPayloadTooLargeError, _is_request_too_large
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk._logs.export import LogRecordExportResult
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE

from .otlp_common import Unencodable
from .otlp_proto import encode_ahead, logs_to_otlp_proto, spans_to_otlp_proto
from .spans import readable_spans

__all__ = ["DirectGrpcLogExporter", "DirectGrpcSpanExporter", "DirectHttpLogExporter", "DirectHttpSpanExporter"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_LOGS = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"


class _Encoder:
    """One batch's request bytes, from the direct encoder or, when it cannot write them exactly,
    from the SDK's (counted, logged once); the last batch's are kept for the SDK's retries."""

    def __init__(self, what: str, direct: Callable[[Sequence[Any]], bytes],
                 sdk: Callable[[Sequence[Any]], bytes]) -> None:
        self.what, self._direct, self._sdk = what, direct, sdk
        self.fallbacks = 0
        self._last: tuple[Sequence[Any], bytes] | None = None

    def __call__(self, batch: Sequence[Any]) -> bytes:
        last = self._last
        if last is not None and last[0] is batch:
            return last[1]
        try:
            payload = self._direct(batch)
        except Unencodable as exc:
            self.fallbacks += 1
            if self.fallbacks == 1:
                log.info("%s: a batch the direct OTLP encoder cannot write exactly (%s); encoded by the SDK instead "
                         "(said once, counted in the exporter's fallbacks)", self.what, exc)
            payload = self._sdk(batch)
        self._last = (batch, payload)
        return payload

    def forget(self) -> None:
        """Let the last batch go (its export is over)."""
        self._last = None

    def sent(self, batch: Sequence[Any], export: Callable[[Sequence[Any]], T]) -> T:
        """``export(batch)``, which may encode ``batch`` once per retry: encoded once, then forgotten."""
        try:
            return export(batch)
        finally:
            self._last = None


class _RawStub:
    """A stub whose ``Export`` sends request bytes as they are (no serializer) on the SDK's channel."""

    def __init__(self, channel: Any, method: str) -> None:
        self._call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)

    def Export(self, request: bytes, metadata: Any = None, timeout: float | None = None) -> Any:  # the SDK's name
        return self._call(request, metadata=metadata, timeout=timeout)


class _Direct:
    """What the four exporters below add to the SDK's: the encoder (``_codec``: what is logged on
    a fallback, the direct encoder, the SDK's; each looked up when called) and its fallback count."""

    _codec: tuple[str, Callable[[Sequence[Any]], bytes], Callable[[Sequence[Any]], bytes]]

    def __init__(self, **kwargs: Any) -> None:
        self.encoder = _Encoder(*self._codec)
        super().__init__(**kwargs)

    @property
    def fallbacks(self) -> int:
        return self.encoder.fallbacks


class _DirectGrpc(_Direct):
    """The gRPC side: the stub sends the encoder's bytes to ``_method``, encoded once for all retries."""

    _method: str
    _client: Any  # the SDK's stub, replaced by a _RawStub

    def _initialize_channel_and_stub(self) -> None:
        super()._initialize_channel_and_stub()  # type: ignore[misc]
        self._client = _RawStub(self._channel, self._method)  # type: ignore[attr-defined]  # _channel: the SDK's

    def _translate_data(self, data: Sequence[Any]) -> Any:
        return self.encoder(data)

    def export(self, batch: Sequence[Any]) -> Any:
        return self.encoder.sent(batch, super().export)  # type: ignore[misc]


class DirectGrpcSpanExporter(_DirectGrpc, GrpcSpanExporter):
    """``OTLPSpanExporter`` (gRPC), sending :func:`.otlp_proto.spans_to_otlp_proto`'s bytes."""

    _codec = ("OTLP/gRPC spans", lambda b: spans_to_otlp_proto(b),
              lambda b: encode_spans(readable_spans(b)).SerializeToString())
    takes_span_items = True  # the emitter's span items as they are (otel_ebpf.emit.spans)
    encode_ahead = staticmethod(encode_ahead)  # its queue may hold spans encoded ahead (Emitter's encode_ahead)
    _method = _TRACES


class DirectGrpcLogExporter(_DirectGrpc, GrpcLogExporter):
    """``OTLPLogExporter`` (gRPC), sending :func:`.otlp_proto.logs_to_otlp_proto`'s bytes."""

    _codec = ("OTLP/gRPC logs", lambda b: logs_to_otlp_proto(b), lambda b: encode_logs(b).SerializeToString())
    _method = _LOGS


def _post(exporter: Any, what: str, batch: Sequence[Any]) -> bool:
    """The SDK 1.45 HTTP exporters' ``export``: encoding (an error fails the batch, logged), the
    size limit, the post (the transport retries), the exporter's metrics."""
    with exporter._metrics.export_operation(len(batch)) as result:
        try:
            payload = exporter.encoder(batch)
        except Exception as error:  # what the SDK's encoder raises on malformed input, handled as the SDK does
            log.error("Failed to encode %s batch: %s", what, error)
            result.error = error
            return False
        finally:
            exporter.encoder.forget()
        if _is_request_too_large(payload, exporter._max_request_size):
            log.warning("Dropping %s batch: serialized size %d bytes exceeds max_request_size %d bytes.", what,
                        len(payload), exporter._max_request_size)
            result.error = RequestPayloadTooLargeError(f"Serialized {what} request size {len(payload)} bytes exceeds "
                                                       f"max_request_size {exporter._max_request_size} bytes.")
            return False
        sent = exporter._client.export(payload)
        if not sent.success:
            result.error = sent.error
            result.error_attrs = ({HTTP_RESPONSE_STATUS_CODE: sent.status_code}
                                  if sent.status_code is not None else None)
            return False
    return True


class _DirectHttp(_Direct):
    """The HTTP side: ``export`` posts the encoder's bytes (``_noun`` names the batch in the SDK's
    messages; ``_results``: the SDK's success and failure values)."""

    _noun: str
    _results: tuple[Any, Any]

    def export(self, batch: Sequence[Any]) -> Any:
        if self._shutdown:  # type: ignore[attr-defined]
            return super().export(batch)  # type: ignore[misc]  # the SDK's warning and FAILURE
        return self._results[0] if _post(self, self._noun, batch) else self._results[1]


class DirectHttpSpanExporter(_DirectHttp, HttpSpanExporter):
    """``OTLPSpanExporter`` (HTTP/protobuf), posting :func:`.otlp_proto.spans_to_otlp_proto`'s bytes."""

    _codec = ("OTLP/HTTP spans", lambda b: spans_to_otlp_proto(b),
              lambda b: encode_spans(readable_spans(b)).SerializeToString())
    takes_span_items = True  # the emitter's span items as they are (otel_ebpf.emit.spans)
    encode_ahead = staticmethod(encode_ahead)  # its queue may hold spans encoded ahead (Emitter's encode_ahead)
    _noun, _results = "span", (SpanExportResult.SUCCESS, SpanExportResult.FAILURE)


class DirectHttpLogExporter(_DirectHttp, HttpLogExporter):
    """``OTLPLogExporter`` (HTTP/protobuf), posting :func:`.otlp_proto.logs_to_otlp_proto`'s bytes."""

    _codec = ("OTLP/HTTP logs", lambda b: logs_to_otlp_proto(b), lambda b: encode_logs(b).SerializeToString())
    _noun, _results = "logs", (LogRecordExportResult.SUCCESS, LogRecordExportResult.FAILURE)
