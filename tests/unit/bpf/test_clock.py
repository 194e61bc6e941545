"""otel_ebpf.bpf.clock: kernel monotonic time to epoch nanoseconds."""
from __future__ import annotations

import time

from otel_ebpf.bpf.clock import KernelClock

MS = 1_000_000


def test_now_converts_to_wall_clock_within_5ms():
    clock = KernelClock()
    epoch = clock.to_epoch_ns(clock.now_monotonic_ns())
    assert abs(epoch - time.time_ns()) < 5 * MS


def test_offset_is_wall_minus_monotonic():
    clock = KernelClock()
    assert abs(clock.offset_ns - (time.time_ns() - time.monotonic_ns())) < 5 * MS
    assert clock.to_epoch_ns(0) == clock.offset_ns
    assert clock.to_epoch_ns(123) - clock.to_epoch_ns(0) == 123  # a pure shift: durations are kept


def test_recalibrate_stays_sane():
    clock = KernelClock()
    before = clock.offset_ns
    clock.recalibrate()
    assert abs(clock.offset_ns - before) < 5 * MS
    assert abs(clock.to_epoch_ns(time.monotonic_ns()) - time.time_ns()) < 5 * MS


def test_receivers_of_one_context_share_its_clock_and_contexts_do_not_share_one():
    """Every receiver of an agent converts kernel time alike (a start time the python/torch
    program shares with the cuda one gives the same epoch ns, hence the same span ids); no
    module-wide clock ties two agents (or two tests) together."""
    from otel_ebpf.bpf.receiver import BpfReceiver
    from otel_ebpf.core.pipeline import Context, ListConsumer

    ctx = Context()
    first = BpfReceiver(ctx, ListConsumer()).clock
    assert ctx.clock is first and BpfReceiver(ctx, ListConsumer()).clock is first
    given = KernelClock()
    assert BpfReceiver(Context(clock=given), ListConsumer()).clock is given
    other = Context()
    assert BpfReceiver(other, ListConsumer()).clock is not first and other.clock is not first


def test_the_agent_makes_one_clock_for_all_its_receivers_and_a_session_one_for_its_own():
    from otel_ebpf.api import Session
    from otel_ebpf.service.agent import Agent
    from otel_ebpf.service import settings

    agent = Agent(settings.load(None), target_pids=[1])  # the default pipelines
    try:
        clocks = [r.clock for r in agent.receivers.values() if hasattr(r, "clock")]
        assert len(clocks) >= 2 and isinstance(agent.ctx.clock, KernelClock)
        assert all(c is agent.ctx.clock for c in clocks)
    finally:
        agent.shutdown()
    assert isinstance(Session(pids=[1]).ctx.clock, KernelClock)
