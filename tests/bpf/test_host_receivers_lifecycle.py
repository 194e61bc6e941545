"""Lifecycle of the blockio, memory, perf and lifecycle components as the agent builds them (from the
registry, default config): shutdown without start, start, shutdown twice; and the programs
compile for every process (no target pids: node-agent mode) too."""
from __future__ import annotations

import os

import pytest

from otel_ebpf.service import components
from otel_ebpf.core.pipeline import Context, ListConsumer

pytestmark = pytest.mark.bpf
TYPES = ("blockio", "memory", "perf", "lifecycle")


@pytest.mark.parametrize("kind", ["receivers", "processors"])
@pytest.mark.parametrize("type_", TYPES)
@pytest.mark.parametrize("targets", [[os.getpid()], []], ids=["traced", "all_processes"])
def test_default_config_start_and_shutdown_twice(bpf_ready: None, kind: str, type_: str, targets: list[int]) -> None:
    factory = getattr(components, kind)()[type_]
    comp = factory.create(factory.config_class(), Context(target_pids=targets), ListConsumer())
    comp.shutdown()  # safe without start
    comp = factory.create(factory.config_class(), Context(target_pids=targets), ListConsumer())
    comp.start()
    comp.shutdown()
    comp.shutdown()


def test_defaults_in_the_registry() -> None:
    rec, proc = components.receivers(), components.processors()
    # memory: on, with page faults read from /proc unless fault_source: tracepoint (a host-wide probe)
    assert rec["blockio"].default_on and rec["memory"].default_on and not rec["perf"].default_on
    assert rec["memory"].config_class().fault_source == "proc"
    # lifecycle: on (a probe hit per fork, exec and exit); sched: off (a probe hit per context switch)
    assert rec["lifecycle"].default_on and not rec["sched"].default_on
    assert all(proc[t].default_on for t in TYPES)  # pass-through until their receiver is enabled
