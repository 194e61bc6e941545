"""The gateway joins grouped send/recv as one instance per torch collective: the NCCL calls below are those
real PyTorch 2.11 made on the twin for uneven ``all_to_all_single``, ``gather(dst=1)``, ``scatter(src=2)``, a
``batch_isend_irecv`` ring and a blocking ``send``/``recv`` (4 ranks; every op a group, zero-count and self
sends included), traced by two agents of two ranks each; their spans meet, shuffled, in the collective_join."""
from __future__ import annotations

import random

from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.core.events import MetricRecord, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.core.readable import SpanMaker
from otel_ebpf.processors.collective_join import CollectiveJoin, Config
from otel_ebpf.processors.nccl import Config as NcclConfig
from otel_ebpf.processors.nccl import NcclProcessor
from otel_ebpf.receivers.nccl.events import NcclCommInit, NcclGroup, NcclP2P

UID = bytes(range(128))
H = 0x5000
T0 = 1_700_000_000_000_000_000
Op = tuple[str, int, int]  # Send/Recv, peer, count


def torch_ops(rank: int) -> list[list[Op]]:
    """One list of calls per ncclGroupStart..End of ``rank``, in torch 2.11's order (seen on the twin)."""
    a2a = [op for d in range(4) for op in (("Send", d, (rank + d) % 3), ("Recv", d, (d + rank) % 3))]
    gather = [("Recv", s, 2) for s in (0, 2, 3)] if rank == 1 else [("Send", 1, 2)]
    scatter = [("Send", d, 2) for d in (0, 1, 3)] if rank == 2 else [("Recv", 2, 2)]
    ring = [("Send", (rank + 1) % 4, 2), ("Recv", (rank - 1) % 4, 2)]
    blocking = [[("Send", 3, 2)]] if rank == 0 else [[("Recv", 0, 2)]] if rank == 3 else []
    return [a2a, gather, scatter, ring, *blocking]


def agent_spans(ranks: tuple[int, int], drop: tuple[int, int, str] | None = None) -> list[ReadableSpan]:
    """What the agent of ``ranks`` exports (``drop``: the (rank, group number, op) call whose record was lost)."""
    proc = NcclProcessor(NcclConfig(host=f"node{ranks[0]}"), Context(), sink := ListConsumer())
    events: list[object] = []
    for r in ranks:
        pid, t, seqs = 100 + r, T0, dict[tuple[str, int], int]()
        events.append(NcclCommInit(pid, pid, t, t + 1, "ncclCommInitRankConfig", H, 4, r, UID, 0))
        for g, calls in enumerate(torch_ops(r), start=1):
            for op, peer, count in calls:
                t += 10
                seq = seqs[(op, peer)] = seqs.get((op, peer), -1) + 1
                if drop != (r, g, op):
                    events.append(NcclP2P(pid, pid, t, t + 5, op, H, count, 7, peer, 0, seq, g, 0))
            events.append(NcclGroup(pid, pid, t - 10 * len(calls), t + 8, g, len(calls), 0, len(calls)))
    proc.consume(events)
    maker = SpanMaker({"host.name": f"node{ranks[0]}"}, "otel_ebpf.nccl")
    return [maker.make(rec.name, trace_id=rec.trace_id or random.getrandbits(128),
                       span_id=rec.span_id or random.getrandbits(64), parent_span_id=rec.parent_span_id,
                       start_ns=rec.start_ns, end_ns=rec.end_ns, attributes=dict(rec.attributes))
            for rec in sink.take() if isinstance(rec, SpanRecord)]


def joined(spans: list[ReadableSpan], clock: list[float]) -> tuple[list[object], CollectiveJoin, ListConsumer]:
    sink = ListConsumer()
    join = CollectiveJoin(Config(timeout=5.0), Context(), sink, clock=lambda: clock[0], wall_ns=lambda: T0)
    random.Random(7).shuffle(spans)
    for i in range(0, len(spans), 5):
        join.consume(spans[i:i + 5])
    return sink.take(), join, sink


def released(out: list[object], outcome: str) -> float:
    return sum(m.value for m in out if isinstance(m, MetricRecord) and m.name == "nccl.join.p2p.released"
               and m.attributes.get("outcome") == outcome)


def test_each_torch_op_made_of_grouped_send_recv_is_one_instance_of_exactly_its_ranks() -> None:
    out, _join, _sink = joined(agent_spans((0, 1)) + agent_spans((2, 3)), [0.0])
    roots = [s for s in out if isinstance(s, ReadableSpan) and s.name == "nccl GroupP2P"]
    assert sorted(tuple(r.attributes["nccl.group.ranks"]) for r in roots) == [(0, 1, 2, 3)] * 4 + [(0, 3)]
    assert all("nccl.partial" not in r.attributes for r in roots)
    assert len({r.context.trace_id for r in roots}) == 5
    by_sends = sorted((r.attributes["nccl.p2p.sends"], r.attributes["nccl.bytes"]) for r in roots)
    # blocking 1 send, gather 3, scatter 3, ring 4, all-to-all 16 (4 bytes per float32 element)
    assert by_sends == [(1, 8), (3, 24), (3, 24), (4, 32), (16, 4 * sum((r + d) % 3 for r in range(4)
                                                                        for d in range(4)))]
    for root in roots:
        trace = [s for s in out if isinstance(s, ReadableSpan) and s.context.trace_id == root.context.trace_id]
        groups = {s.context.span_id for s in trace if s.name == "ncclGroup"}
        assert len(groups) == root.attributes["nccl.group.nranks"]  # one group per rank involved
        for s in trace:
            if s.name in ("ncclSend", "ncclRecv"):
                assert s.parent is not None and s.parent.span_id in groups
            elif s.name == "ncclGroup":
                assert s.parent is not None and s.parent.span_id == root.context.span_id
    assert released(out, "complete") == 5


def test_a_lost_record_gives_a_partial_instance_at_the_timeout_and_nothing_is_lost() -> None:
    clock = [0.0]
    spans = agent_spans((0, 1)) + agent_spans((2, 3), drop=(3, 5, "Recv"))  # the blocking recv
    out, join, sink = joined(spans, clock)
    assert len(join.p2p) == 2  # rank 0's send with its group, rank 3's group span: no edge joins them
    clock[0] = 6.0
    join.consume([])
    out += sink.take()
    partial = sorted((s for s in out if isinstance(s, ReadableSpan) and s.name == "nccl GroupP2P"
                      and s.attributes.get("nccl.partial")), key=lambda s: len(s.attributes["nccl.group.ranks"]))
    assert [tuple(s.attributes["nccl.group.ranks"]) for s in partial] == [(), (0,)]
    assert partial[1].attributes["nccl.p2p.unmatched"] == 1 and partial[0].attributes["nccl.group.incomplete"] == 1
    names = ("ncclSend", "ncclRecv", "ncclGroup")
    sent = sum(1 for s in spans if s.name in names)
    assert sum(1 for s in out if isinstance(s, ReadableSpan) and s.name in names) == sent
    assert released(out, "partial") == 2 and released(out, "complete") == 4
    assert len(join.p2p) == 0 and join.p2p.spans == 0
