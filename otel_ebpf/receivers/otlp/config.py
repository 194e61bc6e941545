"""The OTLP receiver's config (``receivers: {otlp: {...}}`` in the gateway config)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc
from otel_ebpf.core.errors import ConfigError

from .server import parse_endpoint

__all__ = ["Config"]

_MIB = 1024 * 1024


@dataclass
class Config:
    grpc_endpoint: str = doc("127.0.0.1:4327", "OTLP/gRPC listen address HOST:PORT (port 0: any free port; "
                                               "empty: off). Loopback unless set; 4327/4328 leave 4317/4318 "
                                               "to a Collector on the same host.")
    http_endpoint: str = doc("127.0.0.1:4328", "OTLP/HTTP listen address HOST:PORT (POST /v1/traces, "
                                               "/v1/metrics, /v1/logs); empty: off.")
    max_request_bytes: int = doc(16 * _MIB, "Largest export request accepted once decompressed; larger ones "
                                            "are refused (RESOURCE_EXHAUSTED / 413) and counted.", min=1)
    max_workers: int = doc(8, "Server threads per transport (each handles one request at a time).", min=1)
    wait_for_room: float = doc(0.1, "How long a request waits for room in a full gateway queue (holding one "
                                    "server thread) before it is refused whole: UNAVAILABLE / 503, counted in "
                                    "otel_ebpf.events.refused; the agent retries it. 0: refuse at once.",
                               duration=True, max=10)
    retry_after: float = doc(1.0, "Retry hint sent with a refusal: google.rpc.RetryInfo (gRPC) and "
                                  "Retry-After in whole seconds, rounded up (HTTP). The SDK's OTLP exporters "
                                  "wait that long before retrying, within their own timeout.", duration=True,
                             min=0.001, max=3600)

    def validate(self, path: str) -> None:
        for key in ("grpc_endpoint", "http_endpoint"):
            value = getattr(self, key)
            if value:
                parse_endpoint(value, what=f"{path}.{key}")
        if not (self.grpc_endpoint or self.http_endpoint):
            raise ConfigError(path, "enable grpc_endpoint or http_endpoint (both are empty)")
