"""The agent's ticker: every pipeline gets a Tick each TICK_INTERVAL_S while no data flows (nccl_watch's
silence checks need them), and it stops with the agent. A pipeline without BPF receivers (nvml only)."""
from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest

from otel_ebpf.core.events import Tick
from otel_ebpf.service import agent as agent_module
from otel_ebpf.service import settings


def test_ticks_reach_the_processors_while_nothing_else_flows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_module, "TICK_INTERVAL_S", 0.05)
    cfg = settings.load(output=str(tmp_path / "out"), extra={
        "service": {"health_endpoint": "", "pipelines": {"default": {"receivers": ["nvml"],
                                                                     "processors": ["nccl_watch"]}}}})
    agent = agent_module.Agent(cfg)
    (pipeline,) = agent.pipelines
    seen: list[Tick] = []
    watch = pipeline.processors[0]
    original = watch._handlers[Tick]
    watch._handlers[Tick] = lambda ev, out: (seen.append(ev), original(ev, out))
    agent.start()
    try:
        time.sleep(0.5)
    finally:
        agent.shutdown(timeout=5)
    assert len(seen) >= 3 and all(b.time_ns > a.time_ns for a, b in itertools.pairwise(seen))
    count = len(seen)
    time.sleep(0.2)
    assert len(seen) == count  # stopped with the agent
    assert not any(t.name == "otel-ebpf-tick" for t in threading.enumerate())
    agent.shutdown(timeout=1)  # safe twice


def test_host_cache_evictions_for_room_are_exported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries the resource cache and its exec hints drop for room are counted in otel_ebpf.cache.evictions
    (each tick and at shutdown), the growth only; an exit's evict is not one."""
    monkeypatch.setattr(agent_module, "TICK_INTERVAL_S", 0.05)
    cfg = settings.load(output=str(tmp_path / "out"), extra={
        "service": {"health_endpoint": "", "max_processes": 2,
                    "pipelines": {"default": {"receivers": ["nvml"], "processors": ["nccl_watch"]}}}})
    agent = agent_module.Agent(cfg)
    hints = agent.resources.hints
    agent.start()
    try:
        for pid in range(100, 100 + hints.max_entries + 3):  # 3 over the bound
            hints.exec(pid, 10, {})
        deadline = time.monotonic() + 5
        while agent.ctx.telemetry.get(agent_module.CACHE_EVICTIONS, cache="exec_hints", reason="full") < 3:
            assert time.monotonic() < deadline, "not counted within 5 s"
            time.sleep(0.02)
        hints.exec(999, 10, {})  # one more, counted at shutdown at the latest
    finally:
        agent.shutdown(timeout=5)
    assert agent.ctx.telemetry.get(agent_module.CACHE_EVICTIONS, cache="exec_hints", reason="full") == 4
    assert agent.ctx.telemetry.get(agent_module.CACHE_EVICTIONS, cache="resources", reason="full") == 0
