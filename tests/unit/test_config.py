"""otel_ebpf.core.config: typed build of nested dataclasses, key paths in errors, durations, YAML files."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import pytest

from otel_ebpf.core.config import (
    PipelineConfig,
    ServiceConfig,
    build,
    component_type,
    doc,
    load_yaml_file,
    parse_duration,
    to_plain,
)
from otel_ebpf.core.errors import ConfigError


@dataclass
class Inner:
    size: int = doc(4, "A size.")
    ratio: float = doc(0.5, "A ratio.")
    names: list[str] = doc(["a"], "Names.")
    mode: Literal["fast", "slow"] = doc("fast", "Mode.")
    timeout: float = doc(1.0, "Timeout.", duration=True)
    label: str | None = doc(None, "Optional label.")
    tags: dict[str, str] = doc({}, "Tags.")
    enabled: bool = doc(True, "Enabled.")


@dataclass
class Outer:
    inner: Inner = doc(Inner(), "The inner part.")
    count: int = doc(1, "A count.")

    def validate(self, path: str) -> None:
        if self.count > 100:
            raise ConfigError(f"{path}.count", "must be <= 100")


def error_at(cls: type, data: object, path: str = "") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build(cls, data, path)
    return info.value


def test_build_fills_defaults_and_nests():
    cfg = build(Outer, {"inner": {"size": 9, "names": ["x", "y"]}})
    assert cfg.inner.size == 9 and cfg.inner.names == ["x", "y"]
    assert cfg.inner.ratio == 0.5 and cfg.count == 1 and cfg.inner.mode == "fast"


def test_build_none_means_all_defaults():
    assert build(Outer, None) == Outer()


def test_defaults_are_not_shared_between_instances():
    a, b = build(Outer, {}), build(Outer, {})
    a.inner.names.append("z")
    a.inner.tags["k"] = "v"
    assert b.inner.names == ["a"] and b.inner.tags == {}
    assert Outer().inner is not Outer().inner


def test_unknown_key_names_full_dotted_path():
    err = error_at(Outer, {"inner": {"bogus": 1}}, "receivers.cuda")
    assert err.path == "receivers.cuda.inner.bogus"
    assert "receivers.cuda.inner.bogus" in str(err) and "size" in str(err)  # lists the known keys


def test_unknown_key_at_top_level_has_no_leading_dot():
    assert error_at(Outer, {"bogus": 1}).path == "bogus"


@pytest.mark.parametrize(("data", "path"), [
    ({"count": True}, "count"),                 # bool is not an int
    ({"count": "3"}, "count"),
    ({"count": 1.5}, "count"),
    ({"inner": {"ratio": False}}, "inner.ratio"),
    ({"inner": {"names": "abc"}}, "inner.names"),  # a str is not a list
    ({"inner": {"names": ["ok", 3]}}, "inner.names[1]"),
    ({"inner": {"enabled": "yes"}}, "inner.enabled"),
    ({"inner": {"tags": ["a"]}}, "inner.tags"),
    ({"inner": {"tags": {"k": 1}}}, "inner.tags.k"),
    ({"inner": {"label": 7}}, "inner.label"),
    ({"inner": 5}, "inner"),
])
def test_wrong_types_are_rejected_with_their_path(data, path):
    assert error_at(Outer, data).path == path


def test_int_is_accepted_for_float_and_optional_takes_none():
    cfg = build(Inner, {"ratio": 2, "label": None})
    assert cfg.ratio == 2.0 and isinstance(cfg.ratio, float) and cfg.label is None
    assert build(Inner, {"label": "x"}).label == "x"


def test_literal_choices():
    assert build(Inner, {"mode": "slow"}).mode == "slow"
    err = error_at(Inner, {"mode": "medium"})
    assert err.path == "mode" and "'fast'" in str(err) and "'slow'" in str(err)


def test_validate_hook_runs_with_the_path():
    assert error_at(Outer, {"count": 101}, "processors.x").path == "processors.x.count"


@pytest.mark.parametrize(("value", "seconds"), [
    ("250ms", 0.25), ("2m", 120.0), ("10s", 10.0), ("1h", 3600.0), ("500us", 5e-4), ("7ns", 7e-9),
    (" 1.5 s ", 1.5), ("3", 3.0), (5, 5.0), (0, 0.0), (0.25, 0.25),
])
def test_parse_duration(value, seconds):
    assert parse_duration(value, "p") == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["-1", -1, -0.5, "10 parsecs", "", "ms", True, None, [1]])
def test_parse_duration_rejects(value):
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "service.metrics_interval")
    assert info.value.path == "service.metrics_interval"


def test_duration_fields_go_through_parse_duration():
    assert build(Inner, {"timeout": "250ms"}).timeout == pytest.approx(0.25)
    assert error_at(Inner, {"timeout": "-1"}, "x").path == "x.timeout"


def test_service_config_validation():
    assert build(ServiceConfig, {"metrics_interval": "2m"}, "service").metrics_interval == 120.0
    assert error_at(ServiceConfig, {"metrics_interval": "10ms"}, "service").path == "service.metrics_interval"
    assert error_at(ServiceConfig, {"max_queue": 0}, "service").path == "service.max_queue"
    pipes = build(ServiceConfig, {"pipelines": {"p": {"receivers": ["cuda"]}}}, "service").pipelines
    assert pipes == {"p": PipelineConfig(receivers=["cuda"])}
    assert error_at(ServiceConfig, {"pipelines": {"p": {"recievers": []}}}, "service").path == \
        "service.pipelines.p.recievers"


def test_pause_timeout_is_a_bounded_duration_named_by_its_key():
    assert ServiceConfig().pause_timeout == 2.0
    assert build(ServiceConfig, {"pause_timeout": "500ms"}, "service").pause_timeout == 0.5
    for bad in ("100ms", "10m"):
        err = error_at(ServiceConfig, {"pause_timeout": bad}, "service")
        assert err.path == "service.pause_timeout" and "between 200ms and 300s" in str(err)


def test_to_plain_round_trips_through_build():
    cfg = build(Outer, {"inner": {"mode": "slow", "tags": {"a": "b"}}, "count": 3})
    plain = to_plain(cfg)
    assert plain["inner"]["tags"] == {"a": "b"} and plain["inner"]["names"] == ["a"]
    assert build(Outer, plain) == cfg


def test_component_type():
    assert component_type("otlp/backup") == "otlp"
    assert component_type("cuda") == "cuda"


# ---- load_yaml_file -------------------------------------------------------------------


def write(tmp_path, text: str, mode: int = 0o600):
    p = tmp_path / "agent.yaml"
    p.write_text(text)
    os.chmod(p, mode)
    return p


def test_load_yaml_file_reads_a_mapping(tmp_path):
    assert load_yaml_file(write(tmp_path, "receivers:\n  cuda: {}\n")) == {"receivers": {"cuda": {}}}


def test_load_yaml_file_empty_is_empty_mapping(tmp_path):
    assert load_yaml_file(write(tmp_path, "# nothing\n")) == {}


def test_load_yaml_file_refuses_world_writable(tmp_path):
    p = write(tmp_path, "receivers: {}\n", 0o666)
    with pytest.raises(ConfigError) as info:
        load_yaml_file(p)
    assert str(p) in str(info.value) and "world-writable" in str(info.value)
    assert info.value.hint == f"chmod o-w {p}"
    assert load_yaml_file(p, allow_insecure=True) == {"receivers": {}}


def test_load_yaml_file_group_writable_is_fine(tmp_path):
    assert load_yaml_file(write(tmp_path, "a: 1\n", 0o664)) == {"a": 1}


def test_load_yaml_file_invalid_yaml_names_the_file(tmp_path):
    p = write(tmp_path, "receivers: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_yaml_file(p)
    assert str(p) in str(info.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_load_yaml_file_top_level_must_be_a_mapping(tmp_path, text):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match="top level must be a mapping") as info:
        load_yaml_file(p)
    assert str(p) in str(info.value)


def test_load_yaml_file_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file") as info:
        load_yaml_file(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(info.value)
