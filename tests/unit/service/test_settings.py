"""otel_ebpf.service.settings: defaults < YAML file < OTEL_EBPF_* environment < CLI flags, validated at once.

The component registries are replaced by small fakes, so these tests depend on neither the
real receivers nor processors.
"""
from __future__ import annotations

import os

from dataclasses import dataclass

import pytest
import yaml

from otel_ebpf.service import components, settings
from otel_ebpf.core.config import doc
from otel_ebpf.emit.exporters import FileExporterConfig, OtlpExporterConfig, PrometheusExporterConfig
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.pipeline import Factory


@dataclass
class Limits:
    size: int = doc(8, "Size (a power of two).", pow2=True)
    rate: float = doc(1.0, "Rate.")


@dataclass
class FakeReceiverConfig:
    symbols: list[str] = doc(["a", "b"], "Symbols to probe.")
    limits: Limits = doc(Limits(), "Limits.")


@dataclass
class FakeProcessorConfig:
    timeout: float = doc(5.0, "Timeout.", duration=True, min=0.1)


def _create(config, ctx, next_):
    raise AssertionError("settings must not create components")


RECEIVERS = {"fake": Factory("fake", FakeReceiverConfig, _create),
             "other": Factory("other", FakeReceiverConfig, _create),
             "pair": Factory("pair", FakeReceiverConfig, _create, default_on=False)}  # needs processor 'pair'
PROCESSORS = {"pair": Factory("pair", FakeProcessorConfig, _create)}


@pytest.fixture(autouse=True)
def fake_registry(monkeypatch):
    monkeypatch.setattr(components, "receivers", lambda: dict(RECEIVERS))
    monkeypatch.setattr(components, "processors", lambda: dict(PROCESSORS))
    for name in settings.ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def config_file(tmp_path, data) -> str:
    p = tmp_path / "agent.yaml"
    p.write_text(yaml.safe_dump(data))
    p.chmod(0o600)
    return str(p)


def load_error(*args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        settings.load(*args, **kwargs)
    return info.value


def test_default_config_is_valid_and_complete():
    cfg = settings.load()
    assert set(cfg.receivers) == {"fake", "other", "pair"} and set(cfg.processors) == {"pair"}
    assert cfg.receivers["fake"] == FakeReceiverConfig()
    # validated: the directory made absolute (BCC changes the working directory while it compiles)
    assert cfg.exporters == {"file": FileExporterConfig(directory=os.path.abspath(FileExporterConfig().directory))}
    p = cfg.service.pipelines["default"]
    assert (p.receivers, p.processors, p.exporters) == (["fake", "other"], ["pair"], ["file"])


def test_dump_defaults_loads_back_as_the_default_config(tmp_path):
    dumped = tmp_path / "defaults.yaml"
    dumped.write_text(settings.dump_defaults())
    dumped.chmod(0o600)
    cfg, default = settings.load(str(dumped)), settings.load()
    assert (cfg.receivers, cfg.processors, cfg.service) == (default.receivers, default.processors,
                                                            default.service)
    # the dump also documents the otlp and prometheus exporters, defined but in no pipeline
    assert cfg.exporters == {"file": FileExporterConfig(directory=os.path.abspath(FileExporterConfig().directory)),
                             "otlp": OtlpExporterConfig(), "prometheus": PrometheusExporterConfig()}


def test_file_mappings_merge_into_defaults(tmp_path):
    path = config_file(tmp_path, {"receivers": {"fake": {"limits": {"size": 64}}}})
    fake = settings.load(path).receivers["fake"]
    assert fake.limits == Limits(size=64, rate=1.0)  # rate kept from the defaults
    assert fake.symbols == ["a", "b"]


def test_file_lists_replace_defaults(tmp_path):
    path = config_file(tmp_path, {"receivers": {"fake": {"symbols": ["z"]}},
                                  "service": {"pipelines": {"default": {"receivers": ["fake"]}}}})
    cfg = settings.load(path)
    assert cfg.receivers["fake"].symbols == ["z"]
    p = cfg.service.pipelines["default"]
    assert p.receivers == ["fake"] and p.exporters == ["file"]  # sibling keys still merged


def test_component_ids_with_names(tmp_path):
    path = config_file(tmp_path, {"receivers": {"fake/gpu1": {"symbols": []}},
                                  "service": {"pipelines": {"default": {"receivers": ["fake/gpu1"]}}}})
    cfg = settings.load(path)
    assert cfg.receivers["fake/gpu1"] == FakeReceiverConfig(symbols=[])


def test_output_flag_alone_keeps_only_the_file_exporter(tmp_path):
    cfg = settings.load(output=str(tmp_path / "out"))
    assert cfg.exporters["file"].directory == str(tmp_path / "out")
    assert cfg.service.pipelines["default"].exporters == ["file"]


def test_endpoint_flag_alone_exports_only_otlp():
    cfg = settings.load(endpoint="collector:4317")
    assert cfg.service.pipelines["default"].exporters == ["otlp"]
    assert cfg.exporters["otlp"] == OtlpExporterConfig(endpoint="collector:4317")


def test_endpoint_and_output_export_to_both(tmp_path):
    cfg = settings.load(output=str(tmp_path), endpoint="http://c:4318", protocol="http")
    assert sorted(cfg.service.pipelines["default"].exporters) == ["file", "otlp"]
    assert cfg.exporters["otlp"].protocol == "http" and cfg.exporters["file"].directory == str(tmp_path)


def test_flags_add_to_the_exporters_the_file_lists(tmp_path):
    path = config_file(tmp_path, {"exporters": {"otlp": {"endpoint": "a:1", "protocol": "http"},
                                                "prometheus": {"endpoint": "127.0.0.1:0"}},
                                  "service": {"pipelines": {"default": {"exporters": ["otlp", "prometheus"]}}}})
    cfg = settings.load(path, output=str(tmp_path / "o"))
    assert cfg.service.pipelines["default"].exporters == ["otlp", "prometheus", "file"]
    assert cfg.exporters["file"].directory == str(tmp_path / "o")


def test_flags_add_to_every_pipeline_of_the_file_once(tmp_path):
    path = config_file(tmp_path, {"exporters": {"otlp": {"endpoint": "a:1"}},
                                  "service": {"pipelines": {"a": {"receivers": ["fake"], "exporters": ["otlp"]},
                                                            "b": {"receivers": ["other"], "exporters": ["file"]}}}})
    cfg = settings.load(path, output=str(tmp_path / "o"), endpoint="b:2")
    assert cfg.service.pipelines["a"].exporters == ["otlp", "file"]
    assert cfg.service.pipelines["b"].exporters == ["file", "otlp"]
    assert cfg.exporters["otlp"].endpoint == "b:2"  # the flag sets the endpoint of the file's otlp exporter


def test_a_flag_replaces_the_built_in_default_file_exporter(tmp_path):
    path = config_file(tmp_path, {"service": {"pipelines": {"default": {"receivers": ["other"]}}}})
    assert settings.load(path, endpoint="c:4317").service.pipelines["default"].exporters == ["otlp"]


@pytest.mark.parametrize("receivers, processors, index", [
    (["pair"], [], 0),
    (["fake", "pair"], [], 1),
    (["pair/gpu1"], [], 0),
])
def test_a_receiver_without_its_processor_is_an_error_naming_the_fix(tmp_path, receivers, processors, index):
    path = config_file(tmp_path, {"receivers": {r: {} for r in receivers},
                                  "service": {"pipelines": {"p": {"receivers": receivers, "processors": processors,
                                                                  "exporters": ["file"]}}}})
    err = load_error(path)
    assert err.path == f"service.pipelines.p.receivers[{index}]"
    assert "needs processor 'pair'" in str(err) and "add 'pair' to service.pipelines.p.processors" in str(err)


def test_a_receiver_with_its_processor_by_another_id_or_with_none_to_need_validates(tmp_path):
    path = config_file(tmp_path, {"receivers": {"pair/a": {}}, "processors": {"pair/x": {}},
                                  "service": {"pipelines": {"p": {"receivers": ["pair/a", "fake"],
                                                                  "processors": ["pair/x"], "exporters": ["file"]}}}})
    assert settings.load(path).service.pipelines["p"].receivers == ["pair/a", "fake"]


def test_the_real_registry_pairs_every_bpf_receiver_with_its_processor(monkeypatch):
    monkeypatch.undo()  # the real registries: only nvml has no processor of its own type
    from otel_ebpf.service import components as real
    assert sorted(set(real.receivers()) - set(real.processors())) == ["nvml"]


def test_bad_endpoint_flag_is_a_config_error():
    assert load_error(endpoint="http://:notaport").path == "exporters.otlp.endpoint"


def test_environment_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_EBPF_OUTPUT", str(tmp_path / "env"))
    monkeypatch.setenv("OTEL_EBPF_OTLP_ENDPOINT", "envhost:4317")
    monkeypatch.setenv("OTEL_EBPF_OTLP_PROTOCOL", "http")
    cfg = settings.load()
    assert sorted(cfg.service.pipelines["default"].exporters) == ["file", "otlp"]
    assert cfg.exporters["file"].directory == str(tmp_path / "env")
    assert (cfg.exporters["otlp"].endpoint, cfg.exporters["otlp"].protocol) == ("envhost:4317", "http")


def test_flags_win_over_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_EBPF_OUTPUT", str(tmp_path / "env"))
    cfg = settings.load(output=str(tmp_path / "flag"))
    assert cfg.exporters["file"].directory == str(tmp_path / "flag")


def test_config_path_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OTEL_EBPF_CONFIG", config_file(tmp_path, {"receivers": {"fake": {"symbols": ["e"]}}}))
    assert settings.load().receivers["fake"].symbols == ["e"]


def test_bad_protocol_in_environment_names_the_key(monkeypatch):
    monkeypatch.setenv("OTEL_EBPF_OTLP_ENDPOINT", "h:1")
    monkeypatch.setenv("OTEL_EBPF_OTLP_PROTOCOL", "udp")
    assert load_error().path == "exporters.otlp.protocol"


def test_pipeline_naming_undefined_receiver(tmp_path):
    path = config_file(tmp_path, {"service": {"pipelines": {"default": {"receivers": ["nope"]}}}})
    err = load_error(path)
    assert err.path == "service.pipelines.default.receivers[0]" and "'nope'" in str(err)


@pytest.mark.parametrize(("kind", "ids", "bad"), [
    ("processors", ["pair", "missing"], "service.pipelines.default.processors[1]"),
    ("exporters", ["otlp"], "service.pipelines.default.exporters[0]"),
])
def test_pipeline_naming_undefined_processor_or_exporter(tmp_path, kind, ids, bad):
    path = config_file(tmp_path, {"service": {"pipelines": {"default": {kind: ids}}}})
    assert load_error(path).path == bad


def test_pipeline_needs_a_receiver_and_an_exporter(tmp_path):
    path = config_file(tmp_path, {"service": {"pipelines": {"default": {"exporters": []}}}})
    assert load_error(path).path == "service.pipelines.default"


def test_unknown_component_type(tmp_path):
    err = load_error(config_file(tmp_path, {"receivers": {"gpu/x": {}}}))
    assert err.path == "receivers.gpu/x" and "fake" in str(err)  # lists the known types
    assert load_error(config_file(tmp_path, {"exporters": {"kafka": {}}})).path == "exporters.kafka"


def test_unknown_key_inside_a_component(tmp_path):
    err = load_error(config_file(tmp_path, {"receivers": {"fake": {"limits": {"bogus": 1}}}}))
    assert err.path == "receivers.fake.limits.bogus"


@pytest.mark.parametrize(("data", "path", "message"), [
    ({"receivers": {"fake/x": {"limits": {"size": 6}}}}, "receivers.fake/x.limits.size",
     "must be a power of two, got 6"),
    ({"processors": {"pair": {"timeout": "50ms"}}}, "processors.pair.timeout", "must be at least 100ms, got 50ms"),
])
def test_declared_bounds_are_checked_at_load_naming_the_component(tmp_path, data, path, message):
    err = load_error(config_file(tmp_path, data))
    assert err.path == path and str(err).endswith(message)


def test_unknown_top_level_key(tmp_path):
    assert load_error(config_file(tmp_path, {"recievers": {}})).path == "recievers"


def test_section_must_be_a_mapping(tmp_path):
    assert load_error(config_file(tmp_path, {"processors": ["pair"]})).path == "processors"


def test_file_pipelines_replace_the_default_pipeline(tmp_path):
    path = config_file(tmp_path, {"service": {"pipelines": {"gpu": {"receivers": ["fake"], "exporters": ["file"]}}}})
    cfg = settings.load(path)
    assert list(cfg.service.pipelines) == ["gpu"]  # 'default' would duplicate every span


def test_protocol_without_endpoint_is_an_error_unless_an_otlp_exporter_exists(tmp_path):
    err = load_error(protocol="http")
    assert err.path == "exporters.otlp" and "endpoint" in str(err)
    path = config_file(tmp_path, {"exporters": {"otlp": {"endpoint": "http://127.0.0.1:4318"}},
                                  "service": {"pipelines": {"default": {"exporters": ["otlp"]}}}})
    assert settings.load(path, protocol="http").exporters["otlp"].protocol == "http"
