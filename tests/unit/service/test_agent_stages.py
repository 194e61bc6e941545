"""The agent's stages (emitters, processors) built on a thread during start (``defer_stages``: run's deferred
start, otel_ebpf.service.stages): what the receivers queue meanwhile is delivered, and a stage that fails to build
fails the start, with everything stopped. A pipeline without BPF receivers (nvml only)."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from otel_ebpf.core.errors import OtelEbpfError
from otel_ebpf.core.events import MetricRecord
from otel_ebpf.service import agent as agent_module
from otel_ebpf.service import settings, stages


def _cfg(tmp_path: Path) -> settings.AgentConfig:
    return settings.load(output=str(tmp_path / "out"), extra={
        "service": {"health_endpoint": "", "pipelines": {"default": {"receivers": ["nvml"],
                                                                     "processors": ["nccl_watch"]}}}})


def test_stages_built_during_start_get_what_was_queued_before(tmp_path: Path) -> None:
    agent = agent_module.Agent(_cfg(tmp_path), defer_stages=True)
    assert agent.pipelines == []  # not built yet: nothing of the SDK's is needed before start
    queue = agent._queues["default"]
    early = MetricRecord(1, "x.early", "counter", 1, {})
    queue.consume([early])  # a receiver's record before the stages exist
    seen: list[object] = []
    built = threading.Event()
    original = stages.build_pipelines

    def build(*args: object) -> list[stages.Pipeline]:
        out = original(*args)  # type: ignore[arg-type]
        watch = out[0].processors[0]
        consume = watch.consume
        watch.consume = lambda events: (seen.extend(events), consume(events))
        built.set()
        return out

    agent._build_stages = lambda: build(agent.cfg, agent.ctx, agent.resources, agent._queues)  # type: ignore[method-assign]
    agent.start()
    try:
        assert built.is_set() and len(agent.pipelines) == 1 and agent.pipelines[0].queue is queue
        assert queue.progress[2] == "running"
    finally:
        agent.shutdown(timeout=5)
    assert early in seen


def test_a_stage_that_fails_to_build_fails_the_start_and_stops_everything(tmp_path: Path) -> None:
    agent = agent_module.Agent(_cfg(tmp_path), defer_stages=True)

    def broken() -> list[stages.Pipeline]:
        raise OtelEbpfError("cannot serve Prometheus metrics on 127.0.0.1:9435: Address already in use")

    agent._build_stages = broken  # type: ignore[method-assign]
    agent._queues["default"].consume([MetricRecord(1, "x.lost", "counter", 1, {})])
    with pytest.raises(OtelEbpfError, match="Address already in use"):
        agent.start()
    assert agent.health is None and agent.pipelines == []
    # what the queue held (the record above, and whatever the nvml receiver read before the failure: an NVML is
    # found on some hosts) is counted, not lost silently
    assert agent.ctx.telemetry.get("otel_ebpf.events.dropped", receiver="default", reason="shutdown") >= 1
    assert not any(t.name in ("otel-ebpf-tick", "otel-ebpf-build-stages") for t in threading.enumerate())
    agent.shutdown(timeout=1)  # safe again
