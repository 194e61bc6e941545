"""otel_ebpf.gateway: config (defaults, key paths, overrides), registry lifecycle, deploy file."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from otel_ebpf.config import to_plain
from otel_ebpf.errors import ConfigError
from otel_ebpf.gateway import components
from otel_ebpf.gateway.config import dump_defaults, load
from otel_ebpf.pipeline import Context, ListConsumer

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> str:
    f = tmp_path / "gateway.yaml"
    f.write_text(text)
    f.chmod(0o600)
    return str(f)


def test_defaults_listen_next_to_a_collector_and_write_files():
    cfg = load()
    otlp = cfg.receivers["otlp"]
    assert (otlp.grpc_endpoint, otlp.http_endpoint) == ("127.0.0.1:4327", "127.0.0.1:4328")
    assert cfg.pipeline.processors == ["collective_join"] and cfg.pipeline.exporters == ["file"]
    assert cfg.processors["collective_join"].timeout == 5.0


def test_dump_defaults_is_documented_yaml_that_loads_back(tmp_path):
    text = dump_defaults()
    assert "# " in text
    assert to_plain(load(write(tmp_path, text))) == to_plain(load())


def test_unknown_key_is_named_with_its_path(tmp_path):
    with pytest.raises(ConfigError, match=r"processors\.collective_join\.bogus"):
        load(write(tmp_path, "processors:\n  collective_join:\n    bogus: 1\n"))
    with pytest.raises(ConfigError, match=r"receivers\.otlp\.grpc_endpoint"):
        load(write(tmp_path, "receivers:\n  otlp:\n    grpc_endpoint: nope\n"))
    with pytest.raises(ConfigError, match="unknown processor type 'nccl'"):
        load(write(tmp_path, "processors:\n  nccl: {}\n"))  # the agent's processors are not the gateway's


def test_cli_overrides_set_endpoints_and_exporters(monkeypatch):
    cfg = load(output="/tmp/x", endpoint="http://backend:4317", grpc_endpoint="127.0.0.1:0", http_endpoint="")
    assert cfg.pipeline.exporters == ["otlp", "file"]
    assert cfg.exporters["file"].directory == "/tmp/x" and cfg.exporters["otlp"].endpoint == "http://backend:4317"
    assert (cfg.receivers["otlp"].grpc_endpoint, cfg.receivers["otlp"].http_endpoint) == ("127.0.0.1:0", "")
    monkeypatch.setenv("OTEL_EBPF_GATEWAY_OTLP_ENDPOINT", "http://other:4317")
    monkeypatch.setenv("OTEL_EBPF_OTLP_ENDPOINT", "http://127.0.0.1:4327")  # the agent's: ignored here
    assert load().exporters["otlp"].endpoint == "http://other:4317"


def test_exporting_to_its_own_receiver_is_refused():
    with pytest.raises(ConfigError, match=r"exporters\.otlp\.endpoint"):
        load(endpoint="http://127.0.0.1:4327")


def test_one_pipeline_with_defined_components(tmp_path):
    with pytest.raises(ConfigError, match="exactly one pipeline"):
        load(write(tmp_path, "service:\n  pipelines:\n    a: {receivers: [otlp], exporters: [file]}\n"
                             "    b: {receivers: [otlp], exporters: [file]}\n"))
    with pytest.raises(ConfigError, match=r"service.pipelines.joined.exporters\[0\]"):
        load(write(tmp_path, "service:\n  pipelines:\n    joined: {receivers: [otlp], exporters: [kafka]}\n"))
    cfg = load(write(tmp_path, "service:\n  pipelines:\n    joined: {receivers: [otlp], exporters: [file]}\n"),
               output="/tmp/y")
    assert list(cfg.service.pipelines) == ["joined"] and cfg.pipeline.processors == []


@pytest.mark.parametrize("ptype", sorted(components.processors()))
def test_every_gateway_processor_starts_and_stops_twice(ptype):
    factory = components.processors()[ptype]
    proc = factory.create(factory.config_class(), Context(), ListConsumer())
    proc.shutdown()  # safe without start
    proc.start()
    proc.consume([])
    proc.shutdown()
    proc.shutdown()


def test_loadbalancing_collector_config_routes_traces_by_trace_id_to_two_gateways():
    data = yaml.safe_load((ROOT / "deploy" / "otelcol-gateway-loadbalancing.yaml").read_text())
    lb = data["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    hosts = lb["resolver"]["static"]["hostnames"]
    assert len(hosts) == 2 and all(h.endswith(":4327") for h in hosts)
    traces = data["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and traces["exporters"] == ["loadbalancing"]
    assert set(data["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    for pipe in data["service"]["pipelines"].values():  # every component named is defined
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipe.get(kind, [])) <= set(data[kind])
