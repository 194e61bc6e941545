"""The ``exporters:`` section's configs and the checks made from them before anything starts, without the OTel
SDK: loading a config (and ``run``'s preflight) imports this module only, so ``run -- CMD`` can import the SDK while
its first BPF program compiles (otel_ebpf.service.agent). The exporters these configs build are
:mod:`otel_ebpf.emit.exporters`.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from otel_ebpf.core.config import doc
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.emit.sending import RetryConfig

__all__ = ["DEFAULT_RESOURCE_LABELS", "EXPORTER_TYPES", "FILES", "BatchConfig", "FileExporterConfig",
           "OtlpExporterConfig", "PrometheusExporterConfig", "check_output_directory", "ensure_writable", "node_local",
           "unreachable_endpoints"]

FILES = ("traces.jsonl", "metrics.jsonl", "logs.jsonl")
DEFAULT_RESOURCE_LABELS = ["process.pid", "service.name", "hw.id", "container.id", "k8s.pod.uid", "k8s.pod.name",
                           "k8s.namespace.name", "ml.rank"]


def ensure_writable(directory: str | os.PathLike[str]) -> None:
    """The file exporter's start: create ``directory`` (and its parents), prove that files can be
    made in it (a probe file, created and removed) and that the existing :data:`FILES` in it can be
    appended to, then make ``traces.jsonl`` and ``metrics.jsonl`` (empty; what they hold is kept).
    Raises OSError (errno, strerror and the offending path set) when not; blocks on the disk."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".otel-ebpf-write-check-", dir=path)
    os.close(fd)
    os.unlink(probe)
    for name in FILES:
        file = path / name
        if file.exists() and not os.access(file, os.W_OK):
            raise PermissionError(13, "Permission denied", str(file))
    for name in FILES[:2]:  # traces and metrics; logs.jsonl only once there is a log record
        with open(path / name, "a", encoding="utf-8"):
            pass


@dataclass
class BatchConfig:
    queue_size: int = doc(32768, "Most spans held per exporter (queued, or in the batch being sent or retried); "
                                 "beyond it new spans are dropped and counted (reason export_queue_full). The "
                                 "pipeline never waits for room. Log records have a queue of their own, of the "
                                 "same size (drops counted with signal=logs). A held CUDA call's span takes "
                                 "~0.7 KB (~23 MB when full); the default holds the first second of eight "
                                 "processes that reach the CUDA span budget together (docs/benchmarks.md).",
                          min=1)
    batch_size: int = doc(512, "Most spans (log records) per export request (the gateway's exporters: 2048 unless "
                                 "set, gateway.config.BATCH_SIZE).", min=1)
    batch_delay: float = doc(0.2, "Longest a span (log record) waits before its batch is sent (the OpenTelemetry "
                                  "Collector batch processor's default timeout; a straggler or desync record "
                                  "crosses an agent and a gateway, so each second here is up to two seconds later "
                                  "at the backend).", duration=True)
    metrics_queue_size: int = doc(4, "Most metric collections (one per service.metrics_interval) held per exporter "
                                     "while it is slow or down; beyond it the oldest is dropped and counted "
                                     "(otel_ebpf.metrics.dropped): the next cumulative collection supersedes it.",
                                 min=1)

    def validate(self, path: str) -> None:
        if self.batch_size > self.queue_size:
            raise ConfigError(f"{path}.batch_size", f"must be <= queue_size ({self.queue_size})")


@dataclass
class FileExporterConfig:
    directory: str = doc("./otel-ebpf-out", "Directory for traces.jsonl, metrics.jsonl and logs.jsonl (OTLP/JSON "
                                            "lines, one export request per line, as the Collector's file exporter; "
                                            "logs.jsonl only once there are log records).")
    batch: BatchConfig = doc(BatchConfig(), "Span and log record batching, queue bounds.")
    retry_on_failure: RetryConfig = doc(RetryConfig(), "Retries of a failed export (a full disk).")

    def validate(self, path: str) -> None:
        """Make ``directory`` absolute now: BCC changes the working directory while it compiles, and a
        deferred start builds the exporters during the first compile (otel_ebpf.service.agent)."""
        self.directory = os.path.abspath(self.directory)


@dataclass
class OtlpExporterConfig:
    endpoint: str = doc("http://127.0.0.1:4317",
                        "Collector endpoint. grpc: host:port or http(s)://host:port; "
                        "http: base URL, /v1/traces, /v1/metrics and /v1/logs are appended.")
    protocol: Literal["grpc", "http"] = doc("grpc", "grpc or http (OTLP/HTTP with protobuf bodies).")
    headers: dict[str, str] = doc({}, "Extra request headers (e.g. authorization).")
    timeout: float = doc(10.0, "Per-request timeout.", duration=True)
    compression: Literal["auto", "none", "gzip"] = doc(
        "auto", "Request compression. auto: none when the endpoint is on this node (a loopback address, or one of "
                "this host's own addresses, as a DaemonSet collector reached at the node's IP), gzip otherwise. "
                "gzip costs the agent ~7 us of CPU a span on gRPC (2.6 -> 9.4 us in the exporter) and makes CUDA "
                "call spans ~6x smaller on the wire (docs/benchmarks.md): worth it across a network, not "
                "within a node.")
    insecure: bool = doc(True, "grpc only: plaintext when the endpoint has no https:// scheme.")
    reconnect_backoff_max: float = doc(
        5.0, "grpc only: longest wait between two connection attempts while the collector is unreachable "
             "(gRPC's default is 120 s; the span, metric and log channels share it, so it survives the SDK's channel "
             "re-creation): bounds how late the first export succeeds after the collector comes back.", duration=True,
        min=0.1, max=300.0)
    batch: BatchConfig = doc(BatchConfig(), "Span and log record batching, queue bounds.")
    retry_on_failure: RetryConfig = doc(RetryConfig(), "Retries of a failed export, after the SDK exporter's own "
                                                       "(within timeout): a collector down or refusing for longer.")

    def wire_compression(self) -> tuple[Literal["none", "gzip"], str]:
        """(what the exporters send with, why): ``compression``, with ``auto`` decided from the endpoint's host
        (:func:`node_local`; a name is resolved once, within a second, and cached)."""
        if self.compression != "auto":
            return self.compression, "configured"
        endpoint: str
        decided: tuple[Literal["none", "gzip"], str]
        endpoint, decided = self.__dict__.get("_wire", ("", ("none", "")))
        if endpoint != self.endpoint:  # decided once per endpoint (a name is resolved then)
            host = urlparse(self.endpoint if "://" in self.endpoint else f"http://{self.endpoint}").hostname or ""
            where = node_local(host)
            decided = ("none", f"auto: {host} is {where}") if where else ("gzip", f"auto: {host} is not on this node")
            self.__dict__["_wire"] = (self.endpoint, decided)
        return decided

    def channel_options(self) -> tuple[tuple[str, int], ...]:
        """gRPC channel arguments bounding the reconnect backoff (grpcio 1.85 names, milliseconds)."""
        max_ms = round(self.reconnect_backoff_max * 1000)
        return (("grpc.initial_reconnect_backoff_ms", min(1000, max_ms)),
                ("grpc.max_reconnect_backoff_ms", max_ms))

    def validate(self, path: str) -> None:
        url = self.endpoint if "://" in self.endpoint else f"http://{self.endpoint}"
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"{path}.endpoint", f"not a valid endpoint URL: {self.endpoint!r}")
        try:
            _ = parsed.port
        except ValueError:
            raise ConfigError(f"{path}.endpoint", f"bad port in {self.endpoint!r}") from None


@dataclass
class PrometheusExporterConfig:
    endpoint: str = doc("127.0.0.1:9435", "host:port serving /metrics for Prometheus to scrape (9435: ebpf_exporter's "
                                          "port). Port 0 picks a free one. Loopback unless allow_non_loopback.")
    allow_non_loopback: bool = doc(False, "Allow a non-loopback endpoint (0.0.0.0, a NIC address): anyone who can "
                                          "reach it reads the metrics, with process ids, pod uids and GPU ids.")
    resource_labels: list[str] = doc(DEFAULT_RESOURCE_LABELS,
                                     "Resource attributes copied onto every series as labels (process.pid -> "
                                     "process_pid); the rest of a resource is not exported to Prometheus.")

    @property
    def batch(self) -> BatchConfig:
        """Span batching of the (no-op) span side: the defaults, not configurable."""
        return BatchConfig()

    @property
    def retry_on_failure(self) -> RetryConfig:
        """Retries: the defaults, not configurable (serving the latest metrics does not fail)."""
        return RetryConfig()

    def host_port(self) -> tuple[str, int]:
        host, sep, port = self.endpoint.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(self.endpoint)
        return host, int(port)

    def validate(self, path: str) -> None:
        where = f"{path}.endpoint" if path else "endpoint"
        try:
            host, _port = self.host_port()
        except ValueError:
            raise ConfigError(where, f"expected host:port, got {self.endpoint!r}") from None
        if not self.allow_non_loopback and not _loopback(host):
            raise ConfigError(where, f"{host} is not a loopback address: the metrics would be readable from the "
                                     "network", hint="set allow_non_loopback: true to mean it")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def node_local(host: str, timeout_s: float = 1.0) -> str:
    """How ``host`` (an endpoint's host name or IP literal) is on this node: "loopback", "this host's own
    address", or "" when it is not (or a name did not resolve within ``timeout_s``: its exporter will say why it
    cannot connect). A name counts when every address it resolves to does. Blocks up to ``timeout_s``."""
    if host == "localhost":
        return "loopback"
    try:
        addresses = {ipaddress.ip_address(host.split("%")[0])}
    except ValueError:
        addresses = _resolve(host, timeout_s)
    if not addresses:
        return ""
    if all(a.is_loopback for a in addresses):
        return "loopback"
    import psutil

    own = {ipaddress.ip_address(a.address.split("%")[0]) for nic in psutil.net_if_addrs().values() for a in nic
           if a.family in (socket.AF_INET, socket.AF_INET6)}
    return "this host's own address" if all(a.is_loopback or a in own for a in addresses) else ""


def _resolve(host: str, timeout_s: float) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses ``host`` resolves to, or an empty set (no answer within ``timeout_s``: getaddrinfo has no
    timeout of its own, so it runs on a daemon thread)."""
    found: list[set[ipaddress.IPv4Address | ipaddress.IPv6Address]] = []

    def lookup() -> None:
        try:
            found.append({ipaddress.ip_address(str(info[4][0]).split("%")[0])
                          for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})
        except (OSError, ValueError):
            found.append(set())

    t = threading.Thread(target=lookup, name="otel-ebpf-resolve", daemon=True)
    t.start()
    t.join(timeout_s)
    return found[0] if found else set()


EXPORTER_TYPES: dict[str, type] = {"file": FileExporterConfig, "otlp": OtlpExporterConfig,
                                   "prometheus": PrometheusExporterConfig}


def check_output_directory(cfg: FileExporterConfig | OtlpExporterConfig | PrometheusExporterConfig,
                           key: str) -> None:
    """For a file exporter (``key``: its config path, e.g. ``exporters.file``): create its
    directory and check that it can be written, else raise ConfigError at ``<key>.directory``
    naming the directory. Other exporters: nothing. Services call it for every exporter they
    use before anything starts, so a wrong ``--output`` fails at once (exit 2) instead of
    being retried and warned about after the job ran. Blocks on the disk."""
    if not isinstance(cfg, FileExporterConfig):
        return
    try:
        ensure_writable(cfg.directory)
    except OSError as exc:
        file = str(exc.filename or "")
        where = f" ({file})" if os.path.basename(file) in FILES else ""  # not the probe file's name
        raise ConfigError(f"{key}.directory", f"cannot write to the output directory {cfg.directory}{where}: "
                                              f"{exc.strerror or exc}",
                          hint="give a directory this user can write (--output DIR)") from None


def _connect_error(host: str, port: int, timeout_s: float) -> str | None:
    """Why a TCP connection to ``host:port`` cannot be made (None: it can)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc.strerror or exc}"
    except TimeoutError:
        return f"no answer within {timeout_s:g}s"
    except OSError as exc:
        return exc.strerror or str(exc)


def unreachable_endpoints(exporters: dict[str, Any], timeout_s: float = 1.0) -> dict[str, str]:
    """{exporter id: why} for each OTLP exporter of ``exporters`` ({id: config}) whose endpoint does not
    resolve or take a TCP connection within ``timeout_s``; all are tried at once, so this returns within
    about ``timeout_s`` (a name lookup still running then counts as unreachable). A connection proves
    neither that the endpoint speaks OTLP nor that it takes every signal: that shows at the first export."""
    results: dict[str, str] = {}
    lock = threading.Lock()

    def probe(eid: str, cfg: OtlpExporterConfig) -> None:
        url = cfg.endpoint if "://" in cfg.endpoint else f"http://{cfg.endpoint}"
        parsed = urlparse(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80 if cfg.protocol == "http" else 4317)
        why = _connect_error(parsed.hostname or "", port, timeout_s)
        with lock:
            results[eid] = why or ""

    otlp = {eid: c for eid, c in exporters.items() if isinstance(c, OtlpExporterConfig)}
    threads = [threading.Thread(target=probe, args=(eid, c), name=f"otel-ebpf-probe-{eid}", daemon=True)
               for eid, c in otlp.items()]
    for t in threads:
        t.start()
    end = time.monotonic() + timeout_s + 0.2
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    with lock:
        return {eid: results.get(eid) or f"no answer within {timeout_s:g}s" for eid in otlp if results.get(eid) != ""}
