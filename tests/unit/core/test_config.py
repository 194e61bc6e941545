"""otel_ebpf.core.config: typed build of nested dataclasses, key paths in errors, durations, YAML files."""
from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass
from typing import Literal

import pytest

from otel_ebpf.core.config import (
    PipelineConfig,
    ServiceConfig,
    build,
    component_type,
    constraints_text,
    doc,
    key_path,
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


# ---- declared constraints (doc(min=, max=, pow2=)) -----------------------------------------


@dataclass
class Bounded:
    count: int = doc(4, "A count.", min=1)
    offset: int = doc(0, "An offset.", min=0)
    pages: int = doc(8, "Pages (a power of two).", pow2=True)
    depth: int = doc(16, "Depth (a power of two, at most 256).", pow2=True, max=256)
    rate: int = doc(10, "A rate.", min=0, max=1000)
    ratio: float = doc(0.5, "A ratio.", max=1.0)
    interval: float = doc(1.0, "An interval.", duration=True, min=0.01)
    wait: float = doc(0.2, "A wait.", duration=True, min=0.2, max=300)
    longest: float = doc(60.0, "A longest wait.", duration=True, max=3600)
    label: str | None = doc(None, "Unconstrained.")


@dataclass
class HoldsBounded:
    part: Bounded = doc(Bounded(), "A nested part.")
    parts: list[Bounded] = doc([], "Nested parts.")

    def validate(self, path: str) -> None:
        assert self.part.count >= 1  # declared constraints are checked before validate runs


@pytest.mark.parametrize(("data", "message"), [
    ({"count": 0}, "must be >= 1, got 0"),
    ({"offset": -1}, "must be >= 0, got -1"),
    ({"pages": 3}, "must be a power of two, got 3"),
    ({"pages": 0}, "must be a power of two, got 0"),
    ({"pages": -4}, "must be a power of two, got -4"),
    ({"depth": 512}, "must be a power of two from 1 to 256, got 512"),
    ({"depth": 12}, "must be a power of two from 1 to 256, got 12"),
    ({"rate": 1001}, "must be between 0 and 1000, got 1001"),
    ({"ratio": 1.5}, "must be <= 1, got 1.5"),
    ({"interval": "5ms"}, "must be at least 10ms, got 5ms"),
    ({"wait": "100ms"}, "must be between 200ms and 300s, got 100ms"),
    ({"wait": "10m"}, "must be between 200ms and 300s, got 600s"),
    ({"longest": "2h"}, "must be <= 1h, got 2h"),
    ({"ratio": float("nan")}, "must be <= 1, got nan"),
])
def test_declared_constraints_are_enforced_naming_the_key(data, message):
    err = error_at(Bounded, data, "receivers.x")
    (key,) = data
    assert err.path == f"receivers.x.{key}" and str(err).endswith(message)


@pytest.mark.parametrize("data", [
    {"count": 1, "offset": 0, "pages": 1, "depth": 256, "rate": 0, "ratio": 1.0, "interval": "10ms",
     "wait": "300s", "longest": "1h"},
    {"pages": 1 << 20, "depth": 1, "rate": 1000, "wait": "200ms", "longest": 0},
])
def test_declared_bounds_are_inclusive(data):
    build(Bounded, data)


def test_constraints_in_nested_configs_name_the_full_path():
    assert error_at(HoldsBounded, {"part": {"pages": 6}}, "processors.p").path == "processors.p.part.pages"
    assert error_at(HoldsBounded, {"parts": [{}, {"count": 0}]}).path == "parts[1].count"


def test_constraints_run_before_the_class_validate():
    assert error_at(HoldsBounded, {"part": {"count": 0}}).path == "part.count"  # not an AssertionError


@pytest.mark.parametrize(("default", "extra"), [(3, {"pow2": True}), (0, {"min": 1}), (0.001, {"duration": True,
                                                                                                "min": 0.01})])
def test_a_default_that_breaks_its_own_constraint_fails_at_declaration(default, extra):
    with pytest.raises(ValueError, match="breaks its own constraint"):
        doc(default, "Bad.", **extra)


def test_constraints_text_renders_each_kind():
    texts = {f.name: constraints_text(f) for f in dataclasses.fields(Bounded)}
    assert texts == {"count": ">= 1", "offset": ">= 0", "pages": "a power of two",
                     "depth": "a power of two from 1 to 256", "rate": "between 0 and 1000", "ratio": "<= 1",
                     "interval": "at least 10ms", "wait": "between 200ms and 300s", "longest": "<= 1h",
                     "label": ""}


def test_key_path():
    assert key_path("", "a") == "a" and key_path("receivers.cuda", "a") == "receivers.cuda.a"


# ---- every registered config declares its bounds ----------------------------------------------


def _config_classes() -> list[type]:
    from otel_ebpf.emit.exporters import EXPORTER_TYPES
    from otel_ebpf.gateway import components as gateway_components
    from otel_ebpf.gateway.config import GatewayServiceConfig
    from otel_ebpf.service import components

    factories = [*components.receivers().values(), *components.processors().values(),
                 *gateway_components.receivers().values(), *gateway_components.processors().values()]
    roots = [getattr(f, "config_class", f) for f in factories]
    roots += [ServiceConfig, GatewayServiceConfig, *EXPORTER_TYPES.values()]
    seen: list[type] = []
    todo = list(roots)
    while todo:  # nested configs too (service.k8s, probes.probes[].args[])
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        for hint in typing.get_type_hints(cls).values():
            todo += [t for t in (hint, *typing.get_args(hint)) if dataclasses.is_dataclass(t) and isinstance(t, type)]
    return seen


def _int_fields(cls: type) -> list[dataclasses.Field]:
    hints = typing.get_type_hints(cls)
    return [f for f in dataclasses.fields(cls) if hints[f.name] is int]


def test_the_walk_finds_every_kind_of_config():
    classes = _config_classes()
    assert {"ServiceConfig", "K8sConfig", "GatewayServiceConfig", "ProbeSpec", "ArgSpec"} <= \
        {c.__qualname__ for c in classes}
    assert len({c.__module__ for c in classes if c.__qualname__ == "Config"}) > 20  # every component's


def test_every_int_documented_as_a_power_of_two_declares_pow2():
    undeclared = [f"{cls.__module__}.{cls.__qualname__}.{f.name}" for cls in _config_classes()
                  for f in _int_fields(cls) if "power of two" in f.metadata.get("doc", "")
                  and not f.metadata.get("pow2")]
    assert undeclared == []
    assert any(f.metadata.get("pow2") for cls in _config_classes() for f in _int_fields(cls))


def test_every_component_limit_declares_a_lower_bound():
    # max_* ints size tables and queues: 0 would disable them silently. Exporters are left out: their
    # configs (otel_ebpf.emit) still check by hand.
    from otel_ebpf.gateway import components as gateway_components
    from otel_ebpf.gateway.config import GatewayServiceConfig
    from otel_ebpf.service import components

    factories = [*components.receivers().values(), *components.processors().values(),
                 *gateway_components.receivers().values(), *gateway_components.processors().values()]
    roots = [getattr(f, "config_class", f) for f in factories]
    modules = {r.__module__ for r in (*roots, ServiceConfig, GatewayServiceConfig)}  # nested configs too
    undeclared = [f"{cls.__module__}.{cls.__qualname__}.{f.name}" for cls in _config_classes()
                  if cls.__module__ in modules for f in _int_fields(cls)
                  if f.name.startswith("max_") and f.metadata.get("min") is None and not f.metadata.get("pow2")]
    assert undeclared == []
