"""The collective join's C intake (processors/collective_join/_intake.c) against its Python path: the same random
streams of rank spans (duplicates, mismatches, bad ranks, roots, late spans, spans it must leave alone, ties, bounds
that evict) through a join with it and one without, everything that leaves compared in order, and the held state."""
from __future__ import annotations

import random

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.core.events import Tick
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.collective_join import CollectiveJoin, Config
from otel_ebpf.processors.collective_join.intake import AVAILABLE
from tests.support import nccl_spans

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="the C intake was not built (setup.py build_ext)")

T0 = 1_700_000_000_000_000_000
COMMS = ("00c0ffee00c0ffee", "00beef0000beef00")


def _stream(seed: int, batches: int) -> list[list[object]]:
    """Batches of events, made afresh from ``seed`` (the join owns the spans it is given: each run needs its own)."""
    rnd = random.Random(seed)
    out: list[list[object]] = []
    now = 0
    due: list[tuple[str, int, int]] = []  # (comm, seq, rank) still to come of the collectives under way, shuffled
    front = dict.fromkeys(COMMS, 0)
    for _ in range(batches):
        batch: list[object] = []
        for _ in range(rnd.randint(1, 80)):
            if not due:  # the next collective of a communicator: its ranks in random order, interleaved
                comm = rnd.choice(COMMS)
                front[comm] += 1
                due = [(comm, front[comm], r) for r in range(8)] + due
                rnd.shuffle(due)
            if rnd.random() < 0.8:
                comm, seq, rank = due.pop()
            else:  # anything: a duplicate, an old or unknown collective, a bad rank
                comm, seq = rnd.choice(COMMS), rnd.randint(0, max(front.values()) + 1)
                rank = rnd.randint(0, 7) if rnd.random() > 0.1 else rnd.choice((-1, 8, 9))
            nranks = 8 if rnd.random() > 0.03 else rnd.choice((7, 9))
            start = T0 + seq * 1000 + rnd.choice((0, 0, 5, rnd.randint(0, 900)))  # ties on the last start too
            kw: dict = {"nranks": nranks, "comm": comm, "dur": rnd.randint(1, 2000)}
            roll = rnd.random()
            if roll < 0.04:
                kw["count"] = 2048  # a mismatch
            elif roll < 0.06:
                kw["op"] = "Broadcast"
            extra: dict = {}
            roll = rnd.random()
            if roll < 0.03:
                extra["nccl.captured"] = rnd.choice((True, False))
            elif roll < 0.05:
                extra["nccl.timing"] = "gpu"
            elif roll < 0.07:
                extra["nccl.peer"] = 1
            elif roll < 0.09:
                extra["nccl.rank"] = True  # a bool is no rank
            elif roll < 0.10:
                extra["nccl.seq"] = float(seq)
            if rnd.random() < 0.05:
                batch.append(nccl_spans.root_span(seq, start, nranks=nranks, comm=comm))
                continue
            span = nccl_spans.rank_span(seq, rank, start, host=f"node-{rank % 3}", extra=extra, **kw)
            if rnd.random() < 0.02:
                span._name = "ncclSend"
            if rnd.random() < 0.02:
                span._start_time = None
            batch.append(span)
        if rnd.random() < 0.3:
            now += rnd.choice((1, 3, 40))
            batch.append(Tick(T0 + now))
        out.append(batch)
    return out


def _run(seed: int, c_intake: bool, **cfg) -> tuple[list, tuple, int]:
    clock = [0.0]
    sink = ListConsumer()
    join = CollectiveJoin(Config(**cfg), Context(), sink, clock=lambda: clock[0], wall_ns=lambda: T0 + 99,
                          c_intake=c_intake)
    taken = _counted(join)
    left = []
    for batch in _stream(seed, 40):
        clock[0] += 0.5
        join.consume(batch)
        left += [_seen(e) for e in sink.take()]
    held = (join.store.spans, len(join.store),
            sorted((c, sorted(f.seqs.items()), sorted((r, dict(res.attributes)["host.name"])
                                                      for r, res in f.resources.items()))
                   for c, f in join.store._fronts.items()),
            [(e.key, list(e.ranks), list(e.starts.items()), e.first_start, e.last, e.last_rank, e.end, e.sig,
              e.mismatch) for e in join.store.pending()])
    join.shutdown()
    left += [_seen(e) for e in sink.take()]
    return left, held, taken[0]


def _counted(join: CollectiveJoin) -> list[int]:
    """``[n]``: how many events ``join``'s C intake takes from here on (0 without one)."""
    taken = [0]
    real = join._take
    if real is not None:
        def counting(events, start):
            i = real(events, start)
            taken[0] += i - start
            return i
        join._take = counting
    return taken


def _seen(event: object) -> object:
    """What leaves, as compared: a span's every field (its attributes in their order), anything else as its repr."""
    if not isinstance(event, ReadableSpan):
        return repr(event)
    return (event.name, event.context.trace_id, event.context.span_id, event.parent and event.parent.span_id,
            list(event.attributes.items()), event.start_time, event.end_time,
            [(e.name, e.timestamp, dict(e.attributes or {})) for e in event.events],
            dict(event.resource.attributes), event.status.status_code)


@pytest.mark.parametrize("cfg", [{}, {"max_spans": 20, "max_pending": 6, "max_comms": 1, "timeout": 4.0,
                                      "desync_timeout": 2.0}], ids=["defaults", "tight_bounds"])
@pytest.mark.parametrize("seed", range(12))
def test_the_c_intake_leaves_and_holds_exactly_what_the_python_path_does(seed, cfg):
    python, python_held, none_taken = _run(seed, False, **cfg)
    c, c_held, taken = _run(seed, True, **cfg)
    assert none_taken == 0
    assert taken > (200 if not cfg else 20)  # it took its share, not nothing
    assert c_held == python_held
    assert c == python


def test_in_order_ranks_are_all_taken_but_each_collectives_first_and_last():
    join = CollectiveJoin(Config(), Context(), ListConsumer(), clock=lambda: 0.0)
    counted = _counted(join)
    for seq in range(3):
        join.consume([nccl_spans.rank_span(seq, r, T0 + r, nranks=64) for r in range(64)])
    # The first collective: none (each rank's wavefront entry is new); after: all but the first and the last rank.
    assert counted[0] == 2 * 62
    assert len(join.store) == 0 and join.store.spans == 0
