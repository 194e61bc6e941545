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


class FakeClocks:
    """A monotonic and a wall clock the test moves; each read advances both by ``tick`` ns (a read takes time)."""

    def __init__(self, tick: int = 100) -> None:
        self.mono_ns, self.wall_ns, self.tick = 5_000 * MS, 1_700_000_000_000 * MS, tick
        self.stall_next_wall = 0  # ns the next wall read takes (a thread preempted between its reads)

    def mono(self) -> int:
        self.mono_ns += self.tick
        self.wall_ns += self.tick
        return self.mono_ns

    def wall(self) -> int:
        self.mono_ns += self.tick + self.stall_next_wall
        self.wall_ns += self.tick + self.stall_next_wall
        self.stall_next_wall = 0
        return self.wall_ns

    def run(self, ns: int) -> None:
        self.mono_ns += ns
        self.wall_ns += ns


def test_a_step_of_the_wall_clock_is_found_at_the_next_check_and_later_times_follow_it():
    from otel_ebpf.bpf.clock import CHECK_EVERY_NS

    c = FakeClocks()
    clock = KernelClock(mono=c.mono, wall=c.wall)
    assert abs(clock.to_epoch_ns(c.mono_ns) - c.wall_ns) < 1_000
    c.run(2 * CHECK_EVERY_NS)
    assert clock.check() == 0  # no step: nothing changes
    c.wall_ns += 3_000 * MS  # chrony's makestep: +3 s
    assert clock.check() == 0  # not yet due (checked a moment ago)
    assert abs(clock.to_epoch_ns(c.mono_ns) - c.wall_ns) > 2_900 * MS
    c.run(CHECK_EVERY_NS)
    step = clock.check()
    assert abs(step - 3_000 * MS) < 1_000 and clock.steps == 1
    assert abs(clock.to_epoch_ns(c.mono_ns) - c.wall_ns) < 1_000
    c.run(CHECK_EVERY_NS)
    assert clock.check() == 0 and clock.steps == 1  # found once
    c.wall_ns -= 250 * MS  # backwards too
    c.run(CHECK_EVERY_NS)
    assert abs(clock.check() + 250 * MS) < 1_000 and clock.steps == 2


def test_jitter_under_the_step_size_and_a_preempted_read_change_nothing():
    from otel_ebpf.bpf.clock import CHECK_EVERY_NS, STEP_NS

    c = FakeClocks()
    clock = KernelClock(mono=c.mono, wall=c.wall)
    offset = clock.offset_ns
    c.wall_ns += STEP_NS // 2  # under the step size: the offset holds
    c.run(CHECK_EVERY_NS)
    assert clock.check() == 0 and clock.offset_ns == offset
    c.run(CHECK_EVERY_NS)
    c.stall_next_wall = 20 * MS  # a read bracketed 20 ms wide is off by up to 10 ms: not used
    assert clock.check() == 0 and clock.offset_ns == offset and clock.steps == 0


def test_a_receivers_poll_loop_counts_a_step_once_for_all_receivers():
    from otel_ebpf.bpf.clock import CHECK_EVERY_NS
    from otel_ebpf.bpf.receiver import BpfReceiver
    from otel_ebpf.core.pipeline import Context, ListConsumer

    c = FakeClocks()
    ctx = Context(clock=KernelClock(mono=c.mono, wall=c.wall))
    a, b = BpfReceiver(ctx, ListConsumer()), BpfReceiver(ctx, ListConsumer())
    c.wall_ns += 2_000 * MS
    c.run(CHECK_EVERY_NS)
    a.check_clock()
    b.check_clock()
    assert ctx.telemetry.get("otel_ebpf.clock.steps") == 1
    assert abs(ctx.clock.to_epoch_ns(c.mono_ns) - c.wall_ns) < 1_000
