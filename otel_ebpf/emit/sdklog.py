"""One line per exporter per failure kind instead of the OTel SDK exporters' log record per attempt.

The SDK's OTLP exporters log every failed attempt (``Transient error StatusCode.UNAVAILABLE ...
retrying in 0.91s``, then ``Failed to export metrics ...`` at ERROR), each retry of each batch of
each signal: an unreachable collector printed a dozen lines for a 5 s job, an endpoint that
refuses metrics (Phoenix takes only traces) one ERROR per export. Those attempts are already
counted (``otel_ebpf.export.failed``, and what is lost in ``otel_ebpf.events.dropped`` /
``otel_ebpf.metrics.dropped``) and summed up per exporter at the end of ``run``, so the filter
here lets the first record of each (exporter, kind) through, rewritten to name the exporter and
say that, and keeps the rest at DEBUG level only.

A record is attributed to an exporter by the thread that logs it: the sending queue's worker
(:data:`otel_ebpf.emit.sending.CURRENT`), the only thread that calls the SDK exporters' ``export``.
Records from other threads, and anything below WARNING, pass unchanged. Installed once per
process (:func:`quiet_sdk_export_logs`); thread-safe.
"""
from __future__ import annotations

import enum
import logging
import threading

from otel_ebpf.emit.sending import CURRENT

__all__ = ["SDK_EXPORTER_LOGGERS", "failure_kind", "quiet_sdk_export_logs"]

log = logging.getLogger(__name__)

#: the loggers of opentelemetry-exporter-otlp-proto-{grpc,http} 1.45 that log failed exports
SDK_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._log_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.common.http",
)
_MAX_KEYS = 256


def failure_kind(record: logging.LogRecord) -> str:
    """The kind of failure a SDK record reports: the gRPC status name (``UNAVAILABLE``), ``HTTP 404``,
    an exception's class name, else the message template."""
    args = record.args if isinstance(record.args, tuple) else ()
    for a in args:
        if isinstance(a, enum.Enum):
            return a.name
    if "code: %s" in str(record.msg):  # http: "Failed to export %s batch code: %s, reason: %s"
        code = args[1] if len(args) > 1 else None
        if isinstance(code, int):
            return f"HTTP {code}"
    for a in args:
        if isinstance(a, BaseException):
            return type(a).__name__
    return str(record.msg).split("%", 1)[0].strip() or "error"


class _OncePerKind(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._said: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        queue = getattr(CURRENT, "queue", None)
        if queue is None or record.levelno < logging.WARNING:
            return True
        kind = failure_kind(record)
        key = (queue.name, kind)
        with self._lock:
            first = key not in self._said and len(self._said) < _MAX_KEYS
            self._said.add(key)
        if first and not record.getMessage().startswith(("Shutdown in progress", "Exporter already shutdown")):
            log.warning("exporter %s: %s export failed (%s): %s; retried, and what is lost is counted and "
                        "summed up at exit (further %s failures of this exporter are logged at debug level)",
                        queue.name, queue.signal, kind, record.getMessage(), kind)
        else:
            log.debug("exporter %s: %s", queue.name, record.getMessage())
        return False


_FILTER = _OncePerKind()


def quiet_sdk_export_logs() -> None:
    """Install the filter on :data:`SDK_EXPORTER_LOGGERS` (idempotent)."""
    for name in SDK_EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
