"""What `otel-ebpf run -- CMD` adds to the command's environment (service.agent.command_environment): otel-ebpf's
NCCL profiler plugin when an nccl receiver wants GPU time, a user's plugin chained behind it, and a plain line
when the plugin is not built."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from otel_ebpf import nccl_profiler
from otel_ebpf.service import settings
from otel_ebpf.service.agent import command_environment

PLUGIN = Path("/opt/otel/libnccl-profiler-otel_ebpf.so")


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(nccl_profiler, "plugin_path", lambda: PLUGIN)
    return PLUGIN


def load(tmp_path: Path, data: dict[str, object] | None = None) -> settings.AgentConfig:
    if data is None:
        return settings.load()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return settings.load(str(path))


def test_the_default_pipeline_loads_our_plugin_and_says_so(tmp_path: Path, built: Path) -> None:
    env, line = command_environment(load(tmp_path), {"PATH": "/bin"})
    assert env == {"NCCL_PROFILER_PLUGIN": str(built)}
    assert line == f"NCCL GPU time: the command runs with NCCL_PROFILER_PLUGIN={built}"


def test_a_users_plugin_is_chained_from_the_environment_or_the_config(tmp_path: Path, built: Path) -> None:
    env, line = command_environment(load(tmp_path), {"NCCL_PROFILER_PLUGIN": "inspector"})
    assert env == {"NCCL_PROFILER_PLUGIN": str(built), "OTEL_EBPF_NCCL_PROFILER_CHAIN": "inspector"}
    assert line.endswith(", chaining inspector")
    cfg = load(tmp_path, {"receivers": {"nccl": {"chain_plugin": "/x/libnccl-profiler-mine.so"}}})
    env, _ = command_environment(cfg, {"NCCL_PROFILER_PLUGIN": "inspector"})
    assert env["OTEL_EBPF_NCCL_PROFILER_CHAIN"] == "/x/libnccl-profiler-mine.so"
    env, _ = command_environment(load(tmp_path), {"NCCL_PROFILER_PLUGIN": str(built)})  # ours already: no loop
    assert env == {"NCCL_PROFILER_PLUGIN": str(built)}


def test_nothing_without_an_nccl_receiver_that_wants_gpu_time(tmp_path: Path, built: Path) -> None:
    assert command_environment(load(tmp_path, {"receivers": {"nccl": {"gpu_time": False}}}), {}) == ({}, "")
    cfg = load(tmp_path, {"service": {"pipelines": {"default": {"receivers": ["cuda"]}}}})
    assert command_environment(cfg, {}) == ({}, "")


def test_a_plugin_that_is_not_built_turns_gpu_time_off_in_one_line(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_profiler, "plugin_path", lambda: None)
    env, line = command_environment(load(tmp_path), {})
    assert env == {} and line.startswith("NCCL GPU time is off: libnccl-profiler-otel_ebpf.so is not built")
