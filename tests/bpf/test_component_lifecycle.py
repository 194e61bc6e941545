"""Every registered component, with its default config: created, shut down without start,
started, shut down twice (STYLE.md: one parametrized lifecycle test covers them all).

Receivers load their real BPF programs here (root + BCC, runs in CI), traced on one sleeping
process so nothing else on the machine is touched."""
from __future__ import annotations

import subprocess

import pytest

from otel_ebpf.service import components
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.host.processes import ResourceCache

pytestmark = pytest.mark.bpf


@pytest.fixture(scope="module")
def sleeper():
    p = subprocess.Popen(["sleep", "600"])
    yield p.pid
    p.kill()
    p.wait()


def _ctx(pid: int) -> Context:
    ctx = Context(target_pids=[pid])
    ctx.resources = ResourceCache(max_entries=64)
    return ctx


@pytest.mark.parametrize("kind,name", [("processor", t) for t in components.processors()]
                         + [("receiver", t) for t in components.receivers()])
def test_component_lifecycle(bpf_ready, sleeper, kind, name):
    registry = components.receivers() if kind == "receiver" else components.processors()
    factory = registry[name]
    assert factory.type == name and factory.description
    cfg = factory.config_class()
    cfg.validate(name)  # the defaults are valid
    sink = ListConsumer()
    fresh = factory.create(cfg, _ctx(sleeper), sink)
    fresh.shutdown()  # safe without start
    fresh.shutdown()
    comp = factory.create(cfg, _ctx(sleeper), sink)
    try:
        comp.start()
    finally:
        comp.shutdown()
        comp.shutdown()  # safe twice
