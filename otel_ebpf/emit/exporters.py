"""The SDK exporters the ``exporters:`` section builds (its configs: :mod:`otel_ebpf.emit.exporter_config`).

* ``file``: OTLP JSON lines in a directory (the default: useful with no server at all).
* ``otlp``: the OTel SDK's OTLP exporters over gRPC or HTTP/protobuf, spans and log records
  encoded by :mod:`otel_ebpf.emit.otlp_proto` (the same bytes); gzip or not as
  ``OtlpExporterConfig.wire_compression`` decides (``compression: auto``: none within the node).
  gRPC channels get a bounded reconnect backoff (``reconnect_backoff_max``): docs/reliability.md, "Recovery stall".
* ``prometheus``: a ``/metrics`` endpoint serving the same metrics (off unless a pipeline lists
  it; spans and log records are not sent there). See :mod:`otel_ebpf.emit.prometheus`.

Each exporter's spans, log records and metric collections go through sending queues of its own
(:mod:`otel_ebpf.emit.sending`: bounded, one worker thread each, batching from ``batch``,
retries from ``retry_on_failure``, every drop counted), so one slow or unreachable exporter
never delays another, the pipeline, or metric collection.
"""
from __future__ import annotations

import logging
from typing import Any

from opentelemetry.sdk._logs.export import LogRecordExporter
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from otel_ebpf.core.errors import OtelEbpfError
from otel_ebpf.emit.exporter_config import (
    EXPORTER_TYPES,
    BatchConfig,
    FileExporterConfig,
    OtlpExporterConfig,
    PrometheusExporterConfig,
    check_output_directory,
    unreachable_endpoints,
)
from otel_ebpf.emit.jsonfile import JsonLinesLogExporter, JsonLinesMetricExporter, JsonLinesSpanExporter
from otel_ebpf.emit.sending import RetryConfig

__all__ = ["EXPORTER_TYPES", "BatchConfig", "FileExporterConfig", "OtlpExporterConfig", "PrometheusExporterConfig",
           "RetryConfig", "build_exporters", "build_log_exporter", "check_output_directory", "unreachable_endpoints"]

log = logging.getLogger(__name__)


def _grpc_args(cfg: OtlpExporterConfig) -> dict[str, Any]:
    """The SDK gRPC exporters' arguments, the same for spans, metrics and logs."""
    from grpc import Compression as GrpcCompression

    comp = GrpcCompression.Gzip if cfg.wire_compression()[0] == "gzip" else GrpcCompression.NoCompression
    insecure = cfg.insecure and not cfg.endpoint.startswith("https://")
    headers = tuple((k.lower(), v) for k, v in cfg.headers.items()) or None
    # SDK 1.45 merges these with its own (user agent); typed as str pairs there, ints are what grpc takes
    options: Any = cfg.channel_options()
    return {"endpoint": cfg.endpoint, "insecure": insecure, "headers": headers, "timeout": cfg.timeout,
            "compression": comp, "channel_options": options}


def _http_args(cfg: OtlpExporterConfig, path: str) -> dict[str, Any]:
    """The SDK HTTP exporters' arguments for the signal at ``path`` (``/v1/traces``...)."""
    from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression

    base = cfg.endpoint.rstrip("/")
    if "://" not in base:
        base = f"http://{base}"
    hcomp = HttpCompression.Gzip if cfg.wire_compression()[0] == "gzip" else HttpCompression.NoCompression
    return {"endpoint": f"{base}{path}", "headers": dict(cfg.headers), "timeout": cfg.timeout, "compression": hcomp}


def _otlp(cfg: OtlpExporterConfig) -> tuple[SpanExporter, MetricExporter]:
    """Spans: the SDK's OTLP exporter sending the direct encoder's bytes (otel_ebpf.emit.otlp_direct);
    metrics: the SDK's."""
    from otel_ebpf.emit.otlp_direct import DirectGrpcSpanExporter, DirectHttpSpanExporter

    compression, why = cfg.wire_compression()
    log.info("OTLP/%s exporter to %s: compression %s (%s)", cfg.protocol, cfg.endpoint, compression, why)

    if cfg.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return DirectGrpcSpanExporter(**_grpc_args(cfg)), OTLPMetricExporter(**_grpc_args(cfg))
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetric

    return DirectHttpSpanExporter(**_http_args(cfg, "/v1/traces")), HttpMetric(**_http_args(cfg, "/v1/metrics"))


def build_log_exporter(cfg: FileExporterConfig | OtlpExporterConfig | PrometheusExporterConfig
                       ) -> LogRecordExporter | None:
    """The SDK log record exporter for one configured exporter, None for Prometheus (it has no
    logs). OTLP: the SDK's ``OTLPLogExporter`` (sending otel_ebpf.emit.otlp_proto's bytes) with the
    span exporter's endpoint, headers, TLS, compression, timeout (and gRPC channel options); HTTP
    posts to ``<endpoint>/v1/logs``.
    File: ``logs.jsonl`` next to ``traces.jsonl``."""
    if isinstance(cfg, FileExporterConfig):
        return JsonLinesLogExporter(cfg.directory)
    if isinstance(cfg, PrometheusExporterConfig):
        return None
    from otel_ebpf.emit.otlp_direct import DirectGrpcLogExporter, DirectHttpLogExporter

    if cfg.protocol == "grpc":
        return DirectGrpcLogExporter(**_grpc_args(cfg))
    return DirectHttpLogExporter(**_http_args(cfg, "/v1/logs"))


def build_exporters(cfg: FileExporterConfig | OtlpExporterConfig | PrometheusExporterConfig
                    ) -> tuple[SpanExporter, MetricExporter]:
    """The SDK span and metric exporter for one configured exporter (a file exporter's
    directory is not checked here: :func:`check_output_directory`). A Prometheus endpoint
    listens from here on; OtelEbpfError names it when it cannot."""
    if isinstance(cfg, FileExporterConfig):
        return JsonLinesSpanExporter(cfg.directory), JsonLinesMetricExporter(cfg.directory)
    if isinstance(cfg, PrometheusExporterConfig):
        from otel_ebpf.emit.prometheus import NoSpanExporter, PrometheusMetricExporter

        host, port = cfg.host_port()
        try:
            return NoSpanExporter(), PrometheusMetricExporter(host, port, cfg.resource_labels)
        except OSError as exc:
            raise OtelEbpfError(f"cannot serve Prometheus metrics on {cfg.endpoint}: {exc.strerror or exc}",
                                hint="another program (ebpf_exporter?) may hold the port: set "
                                     "exporters.prometheus.endpoint") from None
    return _otlp(cfg)
