"""The nccl_watch processor fed by an in-memory sink: silence after the threshold and not before, the
adaptive threshold, the rate limit and byte budget, exited processes, the records' attributes, bounded
state, lifecycle; the capture is injected (a fake) except in the last test, which runs py-spy on a real
process."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from otel_ebpf.core.config import build
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.events import LogRecord, MetricRecord, ProcessExit, SpanRecord, Tick
from otel_ebpf.core.ids import collective_ids
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.core.rankstack import RANK_STACK_ATTRIBUTES, RANK_STACK_EVENT
from otel_ebpf.core.telemetry import DROPPED
from otel_ebpf.host.stacks import Frame, StackCapture, ThreadStack
from otel_ebpf.processors.nccl_watch import Config, NcclWatchProcessor
from otel_ebpf.processors.nccl_watch.ranks import CommState, RankTable
from otel_ebpf.service import components

S = 1_000_000_000
T0 = 1_700_000_000 * S  # epoch ns


def call(pid: int, t: float, comm: str = "c1", seq: int = 0, op: str = "AllReduce", rank: int = 0,
         nranks: int = 2, name: str | None = None, **extra: Any) -> SpanRecord:
    end = T0 + int(t * S)
    attrs = {"nccl.op": op, "nccl.comm.id": comm, "nccl.seq": seq, "nccl.rank": rank, "nccl.nranks": nranks, **extra}
    return SpanRecord(pid, name or "nccl" + op, end - 50_000, end, attrs, scope="otel_ebpf.nccl")


def tick(t: float) -> Tick:
    return Tick(T0 + int(t * S))


def stack(pid: int, outcome: str = "ok", text: str = "", message: str = "") -> StackCapture:
    frames = (Frame("stuck_in_dataloader_fetch", "/job/train.py", 14), Frame("main", "/job/train.py", 30))
    threads = (ThreadStack(pid, "MainThread", False, False, frames),) if outcome == "ok" else ()
    return StackCapture(pid, outcome, message, threads,  # type: ignore[arg-type]
                        text or (f'Thread {pid} (idle): "MainThread"\n    stuck_in_dataloader_fetch (train.py:14)'
                                 if outcome == "ok" else ""), duration_s=0.0123)


class Fake:
    """The injected capture: records the pids asked for, answers ``outcome``; ``gate`` holds it."""

    def __init__(self, outcome: str = "ok", text: str = "") -> None:
        self.pids: list[int] = []
        self.outcome, self.text = outcome, text
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, pid: int) -> StackCapture:
        self.pids.append(pid)
        self.gate.wait(5)
        return stack(pid, self.outcome, self.text, message="py-spy said no")


@pytest.fixture
def make() -> Iterator[Callable[..., tuple[NcclWatchProcessor, ListConsumer, Fake]]]:
    made: list[NcclWatchProcessor] = []

    def _make(fake: Fake | None = None, gone: Callable[[int], bool] = lambda pid: False,
              **cfg: Any) -> tuple[NcclWatchProcessor, ListConsumer, Fake]:
        fake = fake or Fake()
        sink = ListConsumer()
        p = NcclWatchProcessor(build(Config, cfg), Context(), sink, capture=fake, gone=gone)
        p.start()
        made.append(p)
        return p, sink, fake
    yield _make
    for p in made:
        p.shutdown()


def logs(sink: ListConsumer) -> list[LogRecord]:
    return [e for e in sink.events if isinstance(e, LogRecord)]


def counted(sink: ListConsumer, name: str, **attrs: Any) -> float:
    return sum(m.value for m in sink.events if isinstance(m, MetricRecord) and m.name == name
               and all(m.attributes.get(k) == v for k, v in attrs.items()))


def settle(p: NcclWatchProcessor, sink: ListConsumer, captures: int) -> None:
    """Until ``captures`` captures have come back into the pipeline (an empty batch drains them)."""
    deadline = time.monotonic() + 5
    while counted(sink, "otel_ebpf.nccl.stack.captures") < captures and time.monotonic() < deadline:
        time.sleep(0.005)
        p.consume([])
    assert counted(sink, "otel_ebpf.nccl.stack.captures") == captures


def steady(pid: int, until: float, every: float = 1.0, comm: str = "c1", rank: int = 0) -> list[SpanRecord]:
    n = int(until / every)
    return [call(pid, i * every, comm=comm, seq=i, rank=rank) for i in range(n + 1)]


def test_every_event_passes_unchanged_and_calls_in_flow_capture_nothing(make: Callable[..., Any]) -> None:
    p, sink, fake = make()
    other = MetricRecord(7, "m", "counter", 1, {})
    root = call(7, 0.5, name="nccl AllReduce")
    batch = [*steady(7, 5), other, root, ProcessExit(8, T0, "x", 0), tick(5.5)]
    p.consume(batch)
    assert sink.events[: len(batch)] == batch
    p.consume([tick(14.9)])  # 9.9 s after the last call: under the 10 s floor
    time.sleep(0.05)
    p.consume([])
    assert fake.pids == [] and logs(sink) == []


def test_a_silent_rank_is_captured_after_its_threshold_not_before(make: Callable[..., Any]) -> None:
    p, sink, fake = make()
    p.consume(steady(7, 5))  # gaps of 1 s: threshold max(10 s, 3 x 1 s) = 10 s
    p.consume([tick(14.99)])
    time.sleep(0.05)
    p.consume([])
    assert fake.pids == []
    p.consume([tick(15.01)])
    settle(p, sink, 1)
    assert fake.pids == [7]
    (rec,) = logs(sink)
    assert rec.pid == 7 and rec.event_name == RANK_STACK_EVENT == "otel_ebpf.nccl.rank.stack"
    assert rec.severity == "WARN" and rec.body.startswith('Thread 7 (idle): "MainThread"')
    assert rec.attributes["nccl.silence_ms"] == 10_010 and rec.attributes["nccl.silence.threshold_ms"] == 10_000


def test_the_threshold_adapts_to_the_longest_recent_gap(make: Callable[..., Any]) -> None:
    p, sink, fake = make()
    p.consume(steady(7, 20, every=5.0))  # gaps of 5 s: threshold 3 x 5 s, decaying (half-life 600 s)
    p.consume([tick(20 + 14.5)])  # threshold then 15 s x 0.5 ** (14.5 / 600) = 14.75 s
    time.sleep(0.05)
    p.consume([])
    assert fake.pids == []
    p.consume([tick(20 + 15.1)])
    settle(p, sink, 1)
    assert logs(sink)[0].attributes["nccl.silence.threshold_ms"] == int(15_000 * 0.5 ** (15.1 / 600))


def test_a_long_gap_raises_the_threshold_up_to_max_silence_and_is_forgotten_by_half_lives() -> None:
    table = RankTable(min_silence_s=10, max_silence_s=300, factor=3, half_life_s=600, max_processes=8, max_comms=4)
    table.call(7, CommState("c", T0, "AllReduce", 0, 0, 2))
    table.call(7, CommState("c", T0 + 100 * S, "AllReduce", 1, 0, 2))  # a 100 s pause (eval, checkpoint)
    rank = table.ranks[7]
    at = T0 + 100 * S
    assert table.threshold_ns(rank, at) == 300 * S  # 3 x 100 s, capped at max_silence
    assert table.threshold_ns(rank, at + 600 * S) == 150 * S  # one half-life: 3 x 50 s
    assert table.threshold_ns(rank, at + 1800 * S) == int(37.5 * S)
    assert table.threshold_ns(rank, at + 6000 * S) == 10 * S  # back to the floor


def test_captures_of_one_silence_back_off(make: Callable[..., Any]) -> None:
    p, sink, fake = make()  # min_interval 30 s, doubling while the silence lasts, up to max_interval
    p.consume(steady(7, 5))
    for t, want in ((15.5, 1), (16.5, 1), (45.4, 1), (45.6, 2), (105.4, 2), (105.6, 3), (225.6, 4), (465.4, 4),
                    (465.6, 5), (945.6, 6), (1545.4, 6), (1545.6, 7)):  # 30, 60, 120, 240, 480, then 600 s
        p.consume([tick(t)])
        settle(p, sink, want)
    assert fake.pids == [7] * 7
    assert counted(sink, "otel_ebpf.nccl.stack.suppressed") == 0  # scheduled repeats are not suppressions


def test_a_new_silence_within_min_interval_of_the_last_capture_is_suppressed_once(make: Callable[..., Any]) -> None:
    p, sink, fake = make(silence_factor=1.0)
    p.consume(steady(7, 5))
    p.consume([tick(15.5)])
    settle(p, sink, 1)  # captured at 15.5: the next capture not before 45.5
    p.consume([call(7, 16, seq=99)])  # it calls again (an 11 s gap: threshold 11 s now)
    for t in (28, 29, 30):  # silent again past 11 s
        p.consume([tick(t)])
    assert counted(sink, "otel_ebpf.nccl.stack.suppressed", reason="rate_limit") == 1
    p.consume([tick(45.6)])
    settle(p, sink, 2)
    assert fake.pids == [7, 7]


def test_an_exited_process_is_not_captured(make: Callable[..., Any]) -> None:
    gone = {9}
    p, sink, fake = make(gone=lambda pid: pid in gone)
    p.consume([*steady(7, 5), *steady(8, 5), *steady(9, 5), ProcessExit(7, T0, "x", 0, source="cuda")])
    p.consume([tick(16)])
    settle(p, sink, 1)
    assert fake.pids == [8] and 9 not in p.table.ranks and 7 not in p.table.ranks
    assert {r.pid for r in logs(sink)} == {8}


def test_a_capture_that_finds_the_process_gone_gives_no_record(make: Callable[..., Any]) -> None:
    p, sink, _ = make(Fake("exited"))
    p.consume([*steady(7, 5), tick(16)])
    settle(p, sink, 1)
    assert logs(sink) == [] and counted(sink, "otel_ebpf.nccl.stack.captures", **{"otel_ebpf.stack.outcome": "exited"})
    assert 7 not in p.table.ranks


def test_one_record_per_communicator_sharing_the_capture(make: Callable[..., Any]) -> None:
    p, sink, _ = make()
    p.consume([call(7, 1, comm="world", seq=0, rank=3, nranks=4, op="Broadcast"),
               call(7, 2, comm="dp", seq=41, rank=1, nranks=2, op="ReduceScatter"),
               call(7, 3, comm="tp", seq=99, rank=1, nranks=2, op="AllReduce")])
    p.consume([tick(14)])
    settle(p, sink, 1)
    recs = {r.attributes["nccl.comm.id"]: r for r in logs(sink)}
    assert set(recs) == {"world", "dp", "tp"} and len({r.body for r in recs.values()}) == 1
    assert dict(recs["dp"].attributes) == {
        "nccl.comm.id": "dp", "nccl.op": "ReduceScatter", "nccl.seq": 41, "nccl.rank": 1, "nccl.nranks": 2,
        "nccl.silence_ms": 12_000, "nccl.silence.threshold_ms": 10_000, "otel_ebpf.stack.outcome": "ok",
        "otel_ebpf.stack.threads": 1, "otel_ebpf.stack.truncated": False, "otel_ebpf.stack.capture_ms": 12.3,
        "code.function.name": "stuck_in_dataloader_fetch", "code.file.path": "/job/train.py",
        "code.line.number": 14}
    assert recs["world"].attributes["nccl.silence_ms"] == 13_000 and recs["world"].attributes["nccl.rank"] == 3
    assert set(recs["dp"].attributes) <= set(RANK_STACK_ATTRIBUTES)
    # in the trace of the collective each comm waits for next: routed (and shown) with the hung collective
    assert recs["dp"].trace_id == collective_ids("dp", 42, 0)[0]
    assert recs["tp"].trace_id == collective_ids("tp", 100, 0)[0]
    body = len(recs["dp"].body.encode())
    assert counted(sink, "otel_ebpf.nccl.stack.bytes") == 3 * body


def test_a_failed_capture_says_why_in_the_record(make: Callable[..., Any]) -> None:
    p, sink, _ = make(Fake("permission"))
    p.consume([*steady(7, 5), tick(16)])
    settle(p, sink, 1)
    (rec,) = logs(sink)
    assert rec.body == "no stack: py-spy said no" and rec.attributes["otel_ebpf.stack.outcome"] == "permission"
    assert "code.function.name" not in rec.attributes


def test_spans_that_are_no_executed_call_are_not_watched(make: Callable[..., Any]) -> None:
    p, _, fake = make()
    p.consume([call(7, 1, name="nccl AllReduce"), call(7, 1, name="ncclAllReduce gpu"),
               call(7, 1, **{"nccl.simulated": True}), call(8, 1, comm="g", **{"nccl.captured": True}),
               SpanRecord(7, "ncclGroup", T0, T0, {"nccl.group.size": 2})])
    assert len(p.table) == 1 and not p.table.ranks[8].comms  # 8 registered, its graph comm not watched
    p.consume([call(8, 2, comm="g"), tick(30)])  # a replayed graph makes no call: later eager spans ignored too
    time.sleep(0.05)
    p.consume([])
    assert fake.pids == []


def test_state_is_bounded_and_every_eviction_is_counted(make: Callable[..., Any]) -> None:
    p, _, _ = make(max_processes=2, max_comms_per_process=2)
    p.consume([call(1, 1), call(2, 1), call(3, 1)])
    assert list(p.table.ranks) == [2, 3]
    p.consume([call(3, 2, comm="a"), call(3, 3, comm="b")])
    assert list(p.table.ranks[3].comms) == ["a", "b"]
    tel = p.ctx.telemetry
    assert tel.get(DROPPED, receiver="nccl_watch", reason="rank_table_full") == 1
    assert tel.get(DROPPED, receiver="nccl_watch", reason="comm_table_full") == 1


def test_a_full_capture_queue_drops_and_counts(make: Callable[..., Any]) -> None:
    fake = Fake()
    fake.gate.clear()  # captures hang until released
    p, sink, _ = make(fake, max_queue=1)
    p.consume([call(1, 1), call(2, 5), call(3, 5), tick(12)])  # only 1 is due: it runs, held
    deadline = time.monotonic() + 5
    while fake.pids != [1] and time.monotonic() < deadline:
        time.sleep(0.005)
    p.consume([tick(16)])  # 2 and 3 are due: 2 waits in the queue, 3 finds it full
    assert p.ctx.telemetry.get(DROPPED, receiver="nccl_watch", reason="capture_queue_full") == 1
    fake.gate.set()
    settle(p, sink, 2)
    p.consume([tick(17)])  # 3 is tried again after min_interval, not at every tick
    time.sleep(0.05)
    p.consume([ProcessExit(1, T0, "x", 0), ProcessExit(2, T0, "x", 0), tick(46.5)])  # 3's retry is due
    settle(p, sink, 3)
    assert fake.pids == [1, 2, 3]


def test_the_byte_budget_suppresses_and_refills(make: Callable[..., Any]) -> None:
    p, sink, fake = make(Fake(text="x" * 1500), max_bytes_per_minute=1024, max_stack_bytes=1500)
    p.consume([call(1, 1), call(2, 1)])
    p.consume([tick(12)])  # 1 takes a capture's worth (1500 bytes: the budget and more); 2 finds it spent
    settle(p, sink, 1)
    assert counted(sink, "otel_ebpf.nccl.stack.suppressed", reason="byte_budget") == 1 and fake.pids == [1]
    p.consume([ProcessExit(1, T0, "x", 0), tick(42.5)])  # 30.5 s refill 520 bytes: 44 left, 2's retry is due
    settle(p, sink, 2)
    assert fake.pids == [1, 2]
    assert counted(sink, "otel_ebpf.nccl.stack.bytes") == 3000


def test_lifecycle_and_shutdown_hands_on_finished_captures_and_counts_the_rest() -> None:
    sink = ListConsumer()
    never = NcclWatchProcessor(Config(), Context(), sink, capture=Fake())
    never.shutdown()
    never.shutdown()  # safe without start, and twice
    fake = Fake()
    fake.gate.clear()
    p = NcclWatchProcessor(build(Config, {"capture_timeout": 0.5}), Context(), sink, capture=fake, gone=lambda _: False)
    p.start()
    p.consume([call(1, 1), call(2, 1), tick(12)])
    deadline = time.monotonic() + 5
    while fake.pids != [1] and time.monotonic() < deadline:  # 1 is running (held), 2 waits in the queue
        time.sleep(0.005)
    threading.Timer(0.2, fake.gate.set).start()
    p.shutdown()
    p.shutdown()
    assert [r.pid for r in logs(sink)] == [1]  # finished during the shutdown wait: handed on
    assert p.ctx.telemetry.get(DROPPED, receiver="nccl_watch", reason="shutdown") == 1


def test_registered_after_nccl_on_by_default_and_config_errors_name_the_key() -> None:
    procs = components.processors()
    order = [t for t, f in procs.items() if f.default_on]
    assert order.index("nccl_watch") == order.index("nccl") + 1
    factory = procs["nccl_watch"]
    assert factory.description and isinstance(factory.create(Config(), Context(), ListConsumer()), NcclWatchProcessor)
    with pytest.raises(ConfigError) as info:
        build(Config, {"min_silence": "20s", "max_silence": "15s"}, "processors.nccl_watch")
    assert info.value.path == "processors.nccl_watch.min_silence"
    with pytest.raises(ConfigError) as info:
        build(Config, {"min_interval": 0.5}, "processors.nccl_watch")
    assert info.value.path == "processors.nccl_watch.min_interval"


STUCK = """\
import time
def stuck_in_dataloader_fetch():
    while True:
        time.sleep(0.05)
print("ready", flush=True)
stuck_in_dataloader_fetch()
"""


def test_a_real_silent_process_gets_its_real_stack(tmp_path: Any) -> None:
    script = tmp_path / "train.py"
    script.write_text(STUCK)
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    sink = ListConsumer()
    p = NcclWatchProcessor(build(Config, {"min_silence": 1, "max_silence": 2}), Context(), sink)
    try:
        assert job.stdout is not None and job.stdout.readline() == "ready\n"
        p.start()
        now = time.time_ns()
        p.consume([SpanRecord(job.pid, "ncclAllReduce", now - 2 * S, now - 2 * S + 1000,
                              {"nccl.op": "AllReduce", "nccl.comm.id": "world", "nccl.seq": 7, "nccl.rank": 2,
                               "nccl.nranks": 4}), Tick(now)])
        settle(p, sink, 1)
    finally:
        p.shutdown()
        job.kill()
        job.wait()
    (rec,) = logs(sink)
    assert rec.attributes["otel_ebpf.stack.outcome"] == "ok", rec.body
    assert rec.attributes["code.function.name"] == "stuck_in_dataloader_fetch"
    assert rec.attributes["code.file.path"] == str(script) and rec.attributes["code.line.number"] == 4
    assert "stuck_in_dataloader_fetch (train.py:4)" in rec.body and rec.attributes["nccl.seq"] == 7
