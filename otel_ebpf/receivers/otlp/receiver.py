"""The OTLP receiver component: an :class:`~.server.OtlpServer` whose decoded export requests
(``ExportTraceServiceRequest``, ``ExportMetricsServiceRequest``, ``ExportLogsServiceRequest``: one
typed event per request) go to the next stage.

Backpressure: when the next stage can refuse (:class:`Offering`, e.g. a ``BoundedQueue`` or
the gateway's ingest), each request is offered whole with ``wait_for_room`` to wait; a refused
request is answered UNAVAILABLE / 503 with a ``retry_after`` hint (see :class:`~.server.OtlpServer`)
and counted in the server's :attr:`stats` (``refused``), so the sender's retry duplicates
nothing. A plain :class:`~otel_ebpf.core.pipeline.Consumer` takes every request. A next stage that decodes trace
requests from their bytes itself (:class:`Decoding`, the gateway's ingest) gets what it made of them instead.

Threads: the next stage is called on the server's threads (up to ``max_workers`` per
transport at once), so it must be thread-safe. Traces, metrics and logs are all accepted.
``start`` raises OtlpBindError naming the endpoint; ``shutdown`` is safe without start and twice.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from otel_ebpf.core.pipeline import Consumer, Context

from .config import Config
from .server import Decoded, OtlpServer, OtlpServerStats

__all__ = ["Decoding", "Offering", "OtlpReceiver", "create"]


@runtime_checkable
class Offering(Consumer, Protocol):
    def offer(self, events: Sequence[object], *, block_s: float = 0.0) -> bool:
        """Take ``events`` whole (True) or none of them (False), waiting up to ``block_s``."""


@runtime_checkable
class Decoding(Protocol):
    def decode_traces(self, raw: bytes) -> Decoded | None:
        """What the next stage makes of a trace request's protobuf bytes (handed to it as the event, in place of
        the parsed request), or None to have them parsed (:class:`~.server.OtlpServer`'s ``decode_traces``)."""


class OtlpReceiver:
    """OTLP/gRPC and OTLP/HTTP in -> decoded requests to ``next_``."""

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        self._next = next_
        self._offer = next_.offer if isinstance(next_, Offering) else None
        self._wait = config.wait_for_room
        self.server = OtlpServer(grpc_endpoint=config.grpc_endpoint or None,
                                 http_endpoint=config.http_endpoint or None, on_traces=self._hand,
                                 on_metrics=self._hand, on_logs=self._hand,
                                 max_request_bytes=config.max_request_bytes, max_workers=config.max_workers,
                                 retry_after=config.retry_after,
                                 decode_traces=next_.decode_traces if isinstance(next_, Decoding) else None)
        self._started = False

    @property
    def stats(self) -> OtlpServerStats:
        return self.server.stats

    @property
    def grpc_port(self) -> int:
        """The bound gRPC port once started; 0 where off."""
        return self.server.grpc_port

    @property
    def http_port(self) -> int:
        """The bound HTTP port once started; 0 where off."""
        return self.server.http_port

    def _hand(self, request: object) -> bool:
        if self._offer is not None:
            return self._offer([request], block_s=self._wait)
        self._next.consume([request])
        return True

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.server.start()

    def shutdown(self) -> None:
        self.server.shutdown()


def create(config: Config, ctx: Context, next_: Consumer) -> OtlpReceiver:
    return OtlpReceiver(config, ctx, next_)
