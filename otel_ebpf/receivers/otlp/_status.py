"""The ``google.rpc.Status`` of a refused OTLP request, shared by both transports of
:class:`receivers.otlp.server.OtlpServer`. Private to the package."""
from __future__ import annotations

from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

__all__: list[str] = []


def retry_status(message: str, retry_after: float) -> status_pb2.Status:
    """``UNAVAILABLE`` carrying one ``google.rpc.RetryInfo`` detail of ``retry_after`` seconds
    (the OTLP spec's throttling response: the client waits that long, then retries)."""
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(retry_after * 1e9))
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message)
    status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return status
