"""otel_ebpf.gateway: config (defaults, key paths, overrides), registry lifecycle, deploy file."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from otel_ebpf.core.config import to_plain
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.gateway import components
from otel_ebpf.gateway.config import dump_defaults, load
from otel_ebpf.core.pipeline import Context, ListConsumer

ROOT = Path(__file__).resolve().parents[3]


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


def test_ingest_and_queue_limits_have_documented_defaults():
    cfg = load()
    otlp, svc = cfg.receivers["otlp"], cfg.service
    assert (otlp.wait_for_room, otlp.retry_after) == (0.1, 1.0)
    assert (svc.max_queue, svc.max_metric_queue, svc.max_export_wait) == (65536, 256, 300.0)
    text = dump_defaults()
    for key in ("wait_for_room:", "retry_after:", "max_queue:", "max_metric_queue:", "max_export_wait:"):
        line = next(i for i, t in enumerate(text.splitlines()) if t.strip().startswith(key))
        assert text.splitlines()[line - 1].strip().startswith("#"), key  # each documented above its key


@pytest.mark.parametrize(("text", "path"), [
    ("receivers:\n  otlp:\n    retry_after: 0s\n", r"receivers\.otlp\.retry_after"),
    ("receivers:\n  otlp:\n    retry_after: 2h\n", r"receivers\.otlp\.retry_after"),
    ("receivers:\n  otlp:\n    wait_for_room: 30s\n", r"receivers\.otlp\.wait_for_room"),
    ("receivers:\n  otlp:\n    wait_for_room: soon\n", r"receivers\.otlp\.wait_for_room"),
    ("service:\n  max_metric_queue: 0\n", r"service\.max_metric_queue"),
    ("service:\n  max_queue: 0\n", r"service\.max_queue"),
    ("service:\n  max_export_wait: 2h\n", r"service\.max_export_wait"),
])
def test_ingest_and_queue_limits_are_validated_naming_the_key(tmp_path, text, path):
    with pytest.raises(ConfigError, match=path):
        load(write(tmp_path, text))


def test_ingest_limits_reach_the_server(tmp_path):
    from otel_ebpf.gateway.service import Gateway

    cfg = load(write(tmp_path, "receivers:\n  otlp: {retry_after: 250ms, wait_for_room: 0s}\n"
                               "service:\n  max_queue: 10\n  max_metric_queue: 3\n  health_endpoint: ''\n"),
               output=str(tmp_path / "out"), grpc_endpoint="127.0.0.1:0", http_endpoint="127.0.0.1:0")
    gw = Gateway(cfg)
    try:
        assert gw.receivers["otlp"].server.retry_after == 0.25
        assert (gw.traces._max, gw.metrics._max) == (10, 3)
    finally:
        gw.shutdown()


def test_exporters_send_batches_of_2048_unless_the_config_says(tmp_path):
    """The gateway's own default (gateway.config.BATCH_SIZE), not the agent's 512: for the default file exporter,
    one the command line adds and one the file adds without a batch_size (and none for prometheus, which has no
    batch); a batch_size or a smaller queue_size the
    file sets is kept, also when the command line names the same exporter."""
    assert {k: e.batch.batch_size for k, e in load(endpoint="http://backend:4317").exporters.items()} \
        == {"file": 2048, "otlp": 2048}
    assert "batch_size: 2048" in dump_defaults()
    path = write(tmp_path, "exporters:\n  otlp: {endpoint: 'http://b:4317', batch: {batch_size: 100}}\n"
                           "  file: {batch: {queue_size: 1000}}\n"
                           "  otlp/b: {endpoint: 'http://d:4317'}\n  prometheus: {endpoint: '127.0.0.1:9464'}\n"
                           "service:\n  pipelines:\n    default: {receivers: [otlp], processors: [], "
                           "exporters: [otlp, file]}\n")
    for cfg in (load(path), load(path, endpoint="http://c:4317", protocol="grpc")):
        assert (cfg.exporters["otlp"].batch.batch_size, cfg.exporters["file"].batch.batch_size,
                cfg.exporters["otlp/b"].batch.batch_size) == (100, 1000, 2048)
        assert cfg.exporters["prometheus"].endpoint == "127.0.0.1:9464"  # built: no batch key added to it
    assert load(path, endpoint="http://c:4317").exporters["otlp"].endpoint == "http://c:4317"
    with pytest.raises(ConfigError, match=r"exporters\.otlp\.batch\.batch_size"):
        load(write(tmp_path, "exporters:\n  otlp: {endpoint: 'http://b:4317', batch: {batch_size: 9, "
                             "queue_size: 8}}\n"))
