"""The collective join's hang reports with the missing ranks' stacks (processors/collective_join/hangs.py): an
agent's silent-rank stack record (core.rankstack) is joined by (communicator, rank) into the desync's
``otel_ebpf.nccl.desync`` log record, span event and warning while it still describes the rank (its seq is the
rank's latest), sent as an update when it comes after the report, at most once per rank per hang; stale stacks
are not used; bounds are counted."""
from __future__ import annotations

import logging

import pytest
from opentelemetry._logs import LogRecord as SdkLogRecord
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import ReadableLogRecord

from otel_ebpf.core.events import LogRecord, Tick
from otel_ebpf.core.pipeline import ListConsumer
from otel_ebpf.core.rankstack import RANK_STACK_EVENT
from otel_ebpf.processors.collective_join.hangs import DESYNC_EVENT
from tests.support.nccl_spans import COMM, node
from tests.unit.processors.test_collective_join import Clock, make, rank_span, roots

STACK = "Thread 77 (idle): \"MainThread\"\n    stuck_in_dataloader_fetch (train.py:14)\n    main (train.py:30)\n"


def stack_record(rank: int, seq: int, *, comm: str = COMM, host: str = "node-b", silence_ms: float = 18_000.0,
                 function: str | None = "stuck_in_dataloader_fetch") -> ReadableLogRecord:
    """What an agent's nccl_watch sends for a silent rank (core.rankstack), as the gateway receives it."""
    attrs: dict = {"nccl.comm.id": comm, "nccl.rank": rank, "nccl.nranks": 4, "nccl.seq": seq,
                   "nccl.op": "AllReduce", "nccl.silence_ms": silence_ms, "nccl.silence.threshold_ms": 10_000.0,
                   "otel_ebpf.stack.outcome": "ok" if function else "not_python", "otel_ebpf.stack.threads": 1,
                   "otel_ebpf.stack.truncated": False, "otel_ebpf.stack.capture_ms": 16.0}
    if function:
        attrs.update({"code.function.name": function, "code.file.path": "train.py", "code.line.number": 14})
    record = SdkLogRecord(timestamp=1, body=STACK if function else "no stack: not a Python process",
                          severity_text="WARN", severity_number=SeverityNumber.WARN, attributes=attrs,
                          event_name=RANK_STACK_EVENT)
    return ReadableLogRecord(record, node(host))


@pytest.fixture
def sink() -> ListConsumer:
    return ListConsumer()


def logs(events: list) -> list[LogRecord]:
    return [e for e in events if isinstance(e, LogRecord) and e.event_name == DESYNC_EVENT]


def hang(sink, clock: Clock, **cfg):
    """Three good collectives, then rank 3 stops sending: seq 3 waits for it."""
    join = make(sink, clock, timeout=5.0, desync_timeout=1.0, **cfg)
    for seq in range(3):
        join.consume([rank_span(seq, r, 10 * seq) for r in range(4)])
    join.consume([rank_span(3, r, 30) for r in range(3)])
    sink.take()
    return join


def test_a_stack_known_at_the_report_is_in_its_record_event_and_warning(sink, caplog) -> None:
    clock = Clock()
    join = hang(sink, clock)
    received = stack_record(3, 2)
    join.consume([received])
    assert sink.take() == [received]  # passed on unchanged, nothing else yet
    clock.t = 1.0
    with caplog.at_level(logging.WARNING, logger="otel_ebpf.processors.collective_join"):
        join.consume([Tick(0)])
    (rec,) = logs(sink.take())
    a = rec.attributes
    assert (a["nccl.comm.id"], a["nccl.seq"], a["nccl.op"]) == (COMM, 3, "AllReduce")
    assert (a["nccl.missing_ranks"], a["nccl.waiting_ranks"]) == ((3,), (0, 1, 2))
    assert a["nccl.missing.stack_ranks"] == (3,)
    assert a["nccl.missing.functions"] == ("stuck_in_dataloader_fetch (train.py:14)",)
    assert a["nccl.missing.silence_ms"] == (18_000.0,) and rec.severity == "WARN" and rec.pid is None
    first, *rest = rec.body.splitlines()
    assert first.startswith(f"NCCL desync: comm {COMM}, seq 3 (AllReduce) has waited 1.0 s for rank 3 of 4; "
                            "ranks 0-2 wait in it.")
    assert rest[0] == "rank 3 (host node-b, pid -1): silent 18.0 s after seq 2, in stuck_in_dataloader_fetch " \
                      "(train.py:14)"
    assert "main (train.py:30)" in rec.body
    assert rec.trace_id == rank_span(3, 0, 30).context.trace_id  # the stuck collective's trace
    assert "rank 3 is in stuck_in_dataloader_fetch (train.py:14)" in caplog.records[-1].getMessage()
    clock.t = 5.0
    join.consume([Tick(0)])
    (root,) = roots(sink.take())
    (event,) = root.events
    assert event.attributes["nccl.missing.functions"] == ("stuck_in_dataloader_fetch (train.py:14)",)


def test_a_stack_after_the_report_is_sent_as_an_update_once(sink) -> None:
    clock = Clock()
    join = hang(sink, clock)
    clock.t = 1.0
    join.consume([Tick(0)])
    (rec,) = logs(sink.take())
    assert "nccl.missing.functions" not in rec.attributes  # no stack yet: agents capture after ~10 s
    clock.t = 5.0
    join.consume([Tick(0)])  # released as partial at timeout: the hang stays open
    sink.take()
    clock.t = 11.0
    join.consume([stack_record(1, 3)])  # a waiting rank's stack: not missing, no update
    assert logs(sink.take()) == []
    join.consume([stack_record(3, 2, silence_ms=10_500.0)])
    (update,) = logs(sink.take())
    assert update.attributes["nccl.desync.update"] is True
    assert update.attributes["nccl.missing.stack_ranks"] == (3,)
    # waited since the collective's first arrival (t=0), as in the report, not since the report (t=1)
    assert update.attributes["nccl.waited_ns"] == 11_000_000_000
    assert update.body.startswith(f"NCCL desync: comm {COMM}, seq 3 (AllReduce) has waited 11.0 s for rank 3 of 4")
    join.consume([stack_record(3, 2, silence_ms=40_000.0)])  # the next capture of the same hang: not again
    assert logs(sink.take()) == []


def test_stale_stacks_and_progress_end_what_a_stack_says(sink) -> None:
    clock = Clock()
    join = hang(sink, clock, stack_max_age=30.0)
    join.consume([stack_record(3, 1)])  # captured while rank 3 was silent after seq 1: it has called seq 2 since
    clock.t = 1.0
    join.consume([Tick(0)])
    (rec,) = logs(sink.take())
    assert "nccl.missing.stack_ranks" not in rec.attributes
    clock.t = 40.0
    join.consume([stack_record(3, 2)])  # after stack_max_age of the hang: no update
    assert logs(sink.take()) == []
    join.consume([rank_span(3, 3, 30)])  # rank 3 comes after all: seq 3 was released as partial, seq 4 runs
    join.consume([rank_span(4, r, 40) for r in range(4)])  # progress: the hang of seq 3 is over
    assert 3 not in [h.seq for h in join.hangs._hangs.values()]


def test_a_non_python_rank_is_named_without_a_frame_and_the_bounds_are_counted(sink) -> None:
    clock = Clock()
    join = hang(sink, clock, max_stacks=2)
    join.consume([stack_record(3, 2, function=None)])
    clock.t = 1.0
    join.consume([Tick(0)])
    (rec,) = logs(sink.take())
    assert rec.attributes["nccl.missing.functions"] == ("no Python frame (not_python)",)
    join.consume([stack_record(r, 3, comm=f"{r:016x}") for r in range(3)])
    assert join.ctx.telemetry.get("otel_ebpf.collective_join.unjoined", reason="stack_evicted") == 2
    assert len(join.hangs._stacks) == 2
