"""Fuzzing the config loader: any YAML or nested data gives a built config or a ConfigError naming
a key path, never another exception (a traceback instead of a message is a bug)."""
from __future__ import annotations

import os
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from otel_ebpf.service import settings
from otel_ebpf.core.config import ServiceConfig, build
from otel_ebpf.emit.exporters import EXPORTER_TYPES
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.gateway import config as gateway_config

KEYS = st.sampled_from(["receivers", "processors", "exporters", "service", "cuda", "nccl", "nvml", "file",
                        "otlp", "otlp/x", "prometheus", "pipelines", "default", "batch", "endpoint",
                        "queue_size", "max_processes", "metrics_interval", "ringbuf_pages", "libraries",
                        "protocol", "headers", "exporters", "timeout", "strict", "resource_attributes",
                        "scrape_interval", "bogus"]) | st.text(max_size=12)
SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
           | st.text(max_size=30) | st.sampled_from(["10s", "-1", "0.0.0.0:1", "grpc", "gzip", "1e9", "ms"]))
TREES = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(KEYS, kids, max_size=5), max_leaves=30)
CONFIGS = st.dictionaries(st.sampled_from(["receivers", "processors", "exporters", "service"]), TREES,
                          max_size=4)


def _load(tmp: Path, text: str) -> None:
    f = tmp / "c.yaml"
    f.write_text(text)
    os.chmod(f, 0o600)
    try:
        settings.load(str(f))
    except ConfigError as exc:
        assert str(exc)  # a message, not an empty error


@given(CONFIGS)
def test_agent_config_tree_gives_config_or_config_error(tmp_path_factory, data):
    _load(tmp_path_factory.mktemp("cfg"), yaml.safe_dump(data))


@given(st.text(max_size=400))
def test_agent_config_any_text_gives_config_or_config_error(tmp_path_factory, text):
    _load(tmp_path_factory.mktemp("txt"), text)


@given(CONFIGS)
def test_gateway_config_tree_gives_config_or_config_error(tmp_path_factory, data):
    f = tmp_path_factory.mktemp("gw") / "g.yaml"
    f.write_text(yaml.safe_dump(data))
    os.chmod(f, 0o600)
    try:
        gateway_config.load(str(f))
    except ConfigError as exc:
        assert str(exc)


@given(TREES, st.sampled_from([ServiceConfig, *EXPORTER_TYPES.values()]))
def test_build_any_value_for_a_section(data, cls):
    try:
        build(cls, data, "x")
    except ConfigError as exc:
        assert str(exc).startswith("x") or "x" in str(exc)
