"""OTLP exporters' ``compression``: ``auto`` sends gzip only off the node (issue 19: gzip cost ~7 us of agent CPU a
span on gRPC, for bytes that never leave the host when the collector is node-local)."""
from __future__ import annotations

import socket
import time

import psutil
import pytest
from grpc import Compression as GrpcCompression
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.emit.exporter_config import node_local
from otel_ebpf.emit.exporters import OtlpExporterConfig, build_exporters, build_log_exporter

REMOTE = "192.0.2.7"  # TEST-NET-1 (RFC 5737): never this host's


def _own_address() -> str | None:
    for nic in psutil.net_if_addrs().values():
        for a in nic:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.3.2.1", "::1"])
def test_loopback_hosts_are_on_the_node(host: str) -> None:
    assert node_local(host) == "loopback"


def test_an_address_of_this_hosts_own_interfaces_is_on_the_node() -> None:
    own = _own_address()
    assert own is not None, "this test needs a host with a non-loopback IPv4 address (CI's VM has eth0)"
    assert node_local(own) == "this host's own address"


def test_other_addresses_and_names_that_do_not_resolve_are_not() -> None:
    assert node_local(REMOTE) == ""
    started = time.monotonic()
    assert node_local("no-such-collector.invalid", timeout_s=1.0) == ""
    assert time.monotonic() - started < 2.0


def _cfg(endpoint: str, **extra: str) -> OtlpExporterConfig:
    return build(OtlpExporterConfig, {"endpoint": endpoint, **extra}, "exporters.otlp")


@pytest.mark.parametrize("endpoint,expected", [
    ("http://127.0.0.1:4317", "none"), ("localhost:4317", "none"), ("http://[::1]:4317", "none"),
    (f"http://{REMOTE}:4317", "gzip"), (f"https://{REMOTE}:4317", "gzip"),
])
def test_auto_is_none_on_the_node_and_gzip_off_it(endpoint: str, expected: str) -> None:
    cfg = _cfg(endpoint)
    assert cfg.compression == "auto"  # the default
    compression, why = cfg.wire_compression()
    assert compression == expected and why.startswith("auto: ")


def test_a_configured_compression_is_kept_whatever_the_endpoint() -> None:
    assert _cfg("http://127.0.0.1:4317", compression="gzip").wire_compression() == ("gzip", "configured")
    assert _cfg(f"http://{REMOTE}:4317", compression="none").wire_compression() == ("none", "configured")
    with pytest.raises(ConfigError) as info:
        _cfg("http://127.0.0.1:4317", compression="zstd")
    assert info.value.path == "exporters.otlp.compression"


def test_the_decision_follows_an_endpoint_changed_after_it_was_made() -> None:
    cfg = _cfg("http://127.0.0.1:4317")
    assert cfg.wire_compression()[0] == "none"
    cfg.endpoint = f"http://{REMOTE}:4317"
    assert cfg.wire_compression()[0] == "gzip"


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_sdk_exporters_get_what_was_decided(protocol: str) -> None:
    """Spans, metrics and log records of one exporter all send with the decided compression."""
    for endpoint, gzip in (("http://127.0.0.1:4317", False), (f"http://{REMOTE}:4317", True)):
        cfg = _cfg(endpoint, protocol=protocol)
        spans, metrics = build_exporters(cfg)
        logs = build_log_exporter(cfg)
        try:
            got = [e._compression for e in (spans, metrics, logs)]  # type: ignore[union-attr]
            if protocol == "grpc":
                assert got == [GrpcCompression.Gzip if gzip else GrpcCompression.NoCompression] * 3
            else:  # the HTTP exporters keep their own enum: compare the value they send in Content-Encoding
                assert [c.value for c in got] == [(HttpCompression.Gzip if gzip else HttpCompression.NoCompression)
                                                   .value] * 3
        finally:
            for e in (spans, metrics, logs):
                e.shutdown()  # type: ignore[union-attr]
