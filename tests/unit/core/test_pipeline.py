"""otel_ebpf.core.pipeline: the bounded hand-off between receivers and processors, and Fanout."""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from otel_ebpf.core.pipeline import BoundedQueue, Component, Consumer, Fanout, ListConsumer
from otel_ebpf.core.telemetry import DROPPED, Telemetry


class Recorder:
    """Keeps every batch it is given, as separate lists; optionally slow or failing."""

    def __init__(self, delay: float = 0.0, fail_on: object = None) -> None:
        self.batches: list[list[object]] = []
        self.delay = delay
        self.fail_on = fail_on
        self.called = threading.Event()

    def consume(self, events: Sequence[object]) -> None:
        self.called.set()
        if self.delay:
            time.sleep(self.delay)
        if self.fail_on is not None and self.fail_on in events:
            raise RuntimeError("stage failed")
        self.batches.append(list(events))

    @property
    def events(self) -> list[object]:
        return [e for b in self.batches for e in b]


@pytest.fixture
def telemetry() -> Telemetry:
    return Telemetry()


def test_full_queue_drops_whole_batches_and_counts_them(telemetry):
    sink = Recorder()
    q = BoundedQueue(sink, telemetry, max_events=5, name="cuda")
    q.consume([1, 2, 3])
    q.consume([4, 5, 6])  # 3 + 3 > 5: the whole batch goes, not a part of it
    q.consume([7, 8])     # exactly at the limit is accepted
    q.consume([9])
    assert telemetry.get(DROPPED, receiver="cuda", reason="queue_full") == 4
    assert telemetry.get(DROPPED, reason="stage_error") == 0
    q.shutdown()  # never started: drains synchronously
    assert sink.events == [1, 2, 3, 7, 8]


def test_space_frees_once_the_worker_has_taken_a_batch(telemetry):
    sink = Recorder()
    q = BoundedQueue(sink, telemetry, max_events=2)
    q.start()
    try:
        for i in range(50):
            q.consume([i, i])
            q.flush()
        assert telemetry.get(DROPPED) == 0
    finally:
        q.shutdown()
    assert sink.events == [i for i in range(50) for _ in range(2)]


def test_order_is_preserved_across_threads_and_batches(telemetry):
    sink = Recorder(delay=0.001)
    q = BoundedQueue(sink, telemetry, max_events=1_000_000)
    q.start()
    for i in range(0, 2000, 4):
        q.consume(list(range(i, i + 4)))
    q.shutdown()
    assert sink.events == list(range(2000))


def test_worker_merges_waiting_batches(telemetry):
    sink = Recorder()
    q = BoundedQueue(sink, telemetry)
    for i in range(10):
        q.consume([i])
    q.start()
    q.shutdown()
    assert sink.batches == [list(range(10))]


def test_empty_batch_is_ignored(telemetry):
    sink = Recorder()
    q = BoundedQueue(sink, telemetry, max_events=1)
    q.consume([])
    q.consume([1])
    q.shutdown()
    assert sink.batches == [[1]] and telemetry.get(DROPPED) == 0


def test_raising_stage_is_counted_and_the_worker_goes_on(telemetry):
    sink = Recorder(fail_on="boom")
    q = BoundedQueue(sink, telemetry, name="nccl")
    q.start()
    try:
        q.consume(["boom", "lost"])
        assert sink.called.wait(5)  # taken by the worker, so "after" is a batch of its own
        q.consume(["after"])
    finally:
        q.shutdown()
    assert telemetry.get(DROPPED, receiver="nccl", reason="stage_error") == 2
    assert sink.events == ["after"]


def test_shutdown_drains_what_is_queued(telemetry):
    sink = Recorder(delay=0.02)
    q = BoundedQueue(sink, telemetry)
    q.start()
    for i in range(20):
        q.consume([i])
    q.shutdown()
    assert sink.events == list(range(20))


def test_shutdown_deadline_counts_what_is_left_and_loses_nothing_silently(telemetry):
    """A stage slower than the shutdown budget: what the worker holds goes on, what is still
    queued at the deadline is counted dropped (reason shutdown): handed on + counted = all."""
    gate = threading.Event()

    class Held(Recorder):
        def consume(self, events: Sequence[object]) -> None:
            self.called.set()
            gate.wait(10)
            self.batches.append(list(events))

    sink = Held()
    q = BoundedQueue(sink, telemetry, name="default")
    q.start()
    q.consume([0])
    assert sink.called.wait(5)  # the worker holds [0]
    for i in range(1, 21):
        q.consume([i])
    t0 = time.monotonic()
    q.shutdown(time.monotonic() + 0.2)
    assert time.monotonic() - t0 < 5
    assert telemetry.get(DROPPED, receiver="default", reason="shutdown") == 20
    gate.set()
    for _ in range(500):
        if sink.batches:
            break
        time.sleep(0.01)
    assert sink.events == [0]
    assert q.progress[0] == 0


def test_shutdown_twice_and_without_start_is_safe(telemetry):
    BoundedQueue(Recorder(), telemetry).shutdown()
    q = BoundedQueue(Recorder(), telemetry)
    q.shutdown()
    q.shutdown()


def workers() -> int:
    return sum(t.name == "otel-ebpf-lifecycle" for t in threading.enumerate())


def test_start_twice_starts_one_worker_and_shutdown_stops_it(telemetry):
    q = BoundedQueue(Recorder(), telemetry, name="lifecycle")
    q.start()
    q.start()
    assert workers() == 1
    q.shutdown()
    q.shutdown()
    assert workers() == 0


def test_fanout_gives_every_consumer_every_batch_in_order():
    a, b = Recorder(), ListConsumer()
    fan = Fanout([a, b])
    fan.consume([1, 2])
    fan.consume([3])
    assert a.batches == [[1, 2], [3]]
    assert b.take() == [1, 2, 3] and b.take() == []


def test_stages_satisfy_the_protocols(telemetry):
    q = BoundedQueue(ListConsumer(), telemetry)
    assert isinstance(q, Consumer) and isinstance(q, Component)
    assert isinstance(Fanout([]), Consumer) and isinstance(ListConsumer(), Component)


def test_blocking_producer_waits_for_room_instead_of_dropping():
    import threading as _t

    from otel_ebpf.core.pipeline import BoundedQueue
    from otel_ebpf.core.telemetry import Telemetry

    gate = _t.Event()
    seen: list[object] = []

    class Slow:
        def consume(self, events):
            gate.wait(5)
            seen.extend(events)

    tel = Telemetry()
    q = BoundedQueue(Slow(), tel, max_events=10)
    q.start()
    q.consume(list(range(10)))  # fills the queue (the worker takes it and blocks in Slow)
    q.consume(list(range(10, 20)), block_s=5)  # waits for the worker to take the first batch
    _t.Timer(0.3, gate.set).start()
    q.consume(list(range(20, 30)), block_s=5)  # must wait, then fit
    q.shutdown()
    assert tel.get("otel_ebpf.events.dropped") == 0
    assert seen == list(range(30))


def test_batch_larger_than_the_queue_is_accepted_when_empty():
    from otel_ebpf.core.pipeline import BoundedQueue, ListConsumer
    from otel_ebpf.core.telemetry import Telemetry

    out, tel = ListConsumer(), Telemetry()
    q = BoundedQueue(out, tel, max_events=4)
    q.consume(list(range(100)))
    q.shutdown()
    assert out.take() == list(range(100)) and tel.get("otel_ebpf.events.dropped") == 0


def test_offer_queues_all_or_nothing_and_counts_no_drop(telemetry):
    sink = Recorder()
    q = BoundedQueue(sink, telemetry, max_events=5)
    assert q.offer([1, 2, 3])
    assert not q.offer([4, 5, 6])  # 3 + 3 > 5: refused whole, nothing of it queued
    assert q.offer([]) and q.offer([4, 5])
    assert telemetry.get(DROPPED) == 0  # a refusal is the caller's to count
    q.shutdown()
    assert sink.events == [1, 2, 3, 4, 5]


def test_offer_waits_up_to_block_s_for_room(telemetry):
    gate = threading.Event()
    sink = Recorder()

    class Gated:
        def consume(self, events: Sequence[object]) -> None:
            gate.wait(5)
            sink.consume(events)

    q = BoundedQueue(Gated(), telemetry, max_events=4)
    q.start()
    try:
        assert q.offer([1, 2, 3, 4])
        assert sink.called.wait(0) is False
        time.sleep(0.1)  # the worker takes [1..4] and blocks in Gated
        assert q.offer([5, 6, 7, 8])
        t0 = time.monotonic()
        assert not q.offer([9], block_s=0.2)  # still full after 0.2 s
        assert 0.15 <= time.monotonic() - t0 < 2
        threading.Timer(0.2, gate.set).start()
        assert q.offer([9], block_s=5)  # room once the worker moves on
    finally:
        gate.set()
        q.shutdown()
    assert sink.events == list(range(1, 10)) and telemetry.get(DROPPED) == 0
