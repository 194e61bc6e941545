"""The gateway ranks split children that no single agent could: two agents each see 2 of 4 parent ranks
(driven as PyTorch drives NCCL: ncclCommSplit, never ncclCommUserRank/ncclCommCount), their spans meet in the
collective_join, which must give one trace per collective with exactly its communicator's ranks."""
from __future__ import annotations

import random

from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.core.events import SpanRecord
from otel_ebpf.core.ids import split_comm_id
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.core.readable import SpanMaker
from otel_ebpf.processors.collective_join import CollectiveJoin, Config
from otel_ebpf.processors.nccl import Config as NcclConfig
from otel_ebpf.processors.nccl import NcclProcessor
from otel_ebpf.processors.nccl.comms import comm_id_from_unique_id
from otel_ebpf.receivers.nccl.events import (
    NcclCollective,
    NcclCommBind,
    NcclCommInit,
    NcclCommSplit,
    NcclGroup,
    NcclP2P,
)

UID = bytes(range(128))
WORLD = comm_id_from_unique_id(UID, 0)
H = 0x5000
T0 = 1_700_000_000_000_000_000


def agent_spans(ranks: tuple[int, ...], calls: list[tuple[int, int]]) -> list[ReadableSpan]:
    """What the agent of ``ranks`` (a node) exports: the world init, two splits (color, key per rank in
    ``calls``, then new_group([3, 1]): NOCOLOR for 0 and 2) and one all_reduce on each child."""
    proc_ctx, sink = Context(), ListConsumer()
    proc = NcclProcessor(NcclConfig(host=f"node{ranks[0]}"), proc_ctx, sink)
    events: list[object] = [NcclCommInit(100 + r, 100 + r, T0, T0 + 1, "ncclCommInitRankConfig", H, 4, r, UID, 0)
                            for r in ranks]
    for r in ranks:
        color, key = calls[r]
        events.append(NcclCommSplit(100 + r, 100 + r, T0 + 10, T0 + 20, H, 0x10, color, key, 0))
        odd = r in (1, 3)
        events.append(NcclCommSplit(100 + r, 100 + r, T0 + 30, T0 + 40, H, 0x20 if odd else 0, 0 if odd else -1,
                                    (1 if r == 3 else 0), 0))
        events.append(NcclCollective(100 + r, 100 + r, T0 + 50 + r, T0 + 90, "AllReduce", 0x10, 8, 7, 0, None, 0,
                                     0, 0, 0))
        if odd:
            events.append(NcclCollective(100 + r, 100 + r, T0 + 100 + r, T0 + 190, "AllGather", 0x20, 8, 7, None,
                                         None, 0, 0, 0, 0))
    proc.consume(events)
    assert proc_ctx.telemetry.get("otel_ebpf.nccl.unjoined", reason="no_rank") in (None, 0)
    maker = SpanMaker({"host.name": f"node{ranks[0]}"}, "otel_ebpf.nccl")
    return [maker.make(rec.name, trace_id=rec.trace_id or random.getrandbits(128),
                       span_id=rec.span_id or random.getrandbits(64), parent_span_id=rec.parent_span_id,
                       start_ns=rec.start_ns, end_ns=rec.end_ns, attributes=dict(rec.attributes))
            for rec in sink.take() if isinstance(rec, SpanRecord)]


def joined(spans: list[ReadableSpan], **cfg: float) -> tuple[list[ReadableSpan], Context]:
    ctx, sink = Context(), ListConsumer()
    join = CollectiveJoin(Config(**cfg), ctx, sink, clock=lambda: 0.0, wall_ns=lambda: T0)
    join.consume(spans)
    out = [s for s in sink.take() if isinstance(s, ReadableSpan)]
    join.shutdown()
    return out + [s for s in sink.take() if isinstance(s, ReadableSpan)], ctx


# a 2x2 mesh's dimension: color = global rank % 2, keys reversing the parent order within a color
CALLS = [(0, 9), (1, 9), (0, 1), (1, 1)]


def test_two_agents_each_seeing_half_the_parent_give_one_trace_per_collective_with_its_exact_ranks() -> None:
    a, b = agent_spans((0, 1), CALLS), agent_spans((2, 3), CALLS)
    assert all("nccl.rank" not in s.attributes for s in a + b if s.name in ("ncclAllReduce", "ncclAllGather"))
    splits = [s for s in a + b if s.name == "ncclCommSplit"]
    rest = [s for s in a + b if s.name != "ncclCommSplit"]
    out, ctx = joined(rest + splits)  # child spans first: they wait for the splits
    traces: dict[int, dict[int, int]] = {}
    for s in out:
        if s.name in ("ncclAllReduce", "ncclAllGather"):
            traces.setdefault(s.context.trace_id, {})[s.attributes["nccl.rank"]] = s.attributes["nccl.nranks"]
    expected_ranks = {  # child comm id -> parent rank -> child rank (key, then parent rank)
        split_comm_id(WORLD, 0, 0): {2: 0, 0: 1}, split_comm_id(WORLD, 0, 1): {3: 0, 1: 1},
        split_comm_id(WORLD, 1, 0): {1: 0, 3: 1}}
    got: dict[str, dict[int, int]] = {}
    for s in out:
        if s.name in ("ncclAllReduce", "ncclAllGather"):
            attrs = s.attributes
            got.setdefault(attrs["nccl.comm.id"], {})[attrs["nccl.parent.rank"]] = attrs["nccl.rank"]
    assert got == expected_ranks
    assert sorted(traces.values(), key=str) == sorted([{0: 2, 1: 2}] * 3, key=str)
    roots = [s for s in out if s.parent is None and s.name.startswith("nccl ")]
    assert len(roots) == 3 and all(r.attributes["nccl.ranks.arrived"] == 2 for r in roots)
    assert not any(r.attributes.get("nccl.partial") for r in roots)
    assert {r.context.trace_id for r in roots} == set(traces)
    root_of = {r.context.trace_id: r.context.span_id for r in roots}
    ranked = [s for s in out if s.name in ("ncclAllReduce", "ncclAllGather")]
    assert all(s.parent is not None and s.parent.span_id == root_of[s.context.trace_id] for s in ranked)
    assert len({s.context.span_id for s in ranked}) == len(ranked)  # each rank's own derived span id
    assert ctx.telemetry.get("otel_ebpf.collective_join.unjoined", reason="split_unresolved") in (None, 0)


def test_a_split_missing_a_parent_rank_times_out_and_its_spans_pass_unranked_and_counted() -> None:
    a, b = agent_spans((0, 1), CALLS), agent_spans((2, 3), CALLS)
    lost = next(s for s in b if s.name == "ncclCommSplit" and s.attributes["nccl.parent.rank"] == 3
                and s.attributes["nccl.split.seq"] == 0)
    out, ctx = joined([s for s in a + b if s is not lost], timeout=0.0)
    unranked = [s for s in out if s.name == "ncclAllReduce" and "nccl.rank" not in s.attributes]
    assert len(unranked) == 4  # both colors of split 0 wait for rank 3's call, which never came
    assert ctx.telemetry.get("otel_ebpf.collective_join.unjoined", reason="split_unresolved") == 4


def tp_scatter_spans(ranks: tuple[int, int]) -> list[ReadableSpan]:
    """What the agent of ``ranks`` exports for DTensor TP on a (dp, tp) = 2x2 mesh, non-blocking
    (``TORCH_NCCL_USE_COMM_NONBLOCKING=1``, as torch 2.11 did on the twin): the world init, the dp split (color
    rank % 2) and the tp split (color rank // 2), key = parent rank, each child's handle published later
    (NcclCommBind before its first call), then distribute_tensor's scatter from tp rank 0: one group per rank,
    a send to tp rank 1 there, a recv from tp rank 0 at tp rank 1 (seq 0 on the child, peers in child ranks)."""
    proc = NcclProcessor(NcclConfig(host=f"node{ranks[0]}"), Context(), sink := ListConsumer())
    events: list[object] = []
    for r in ranks:
        pid = 100 + r
        events.append(NcclCommInit(pid, pid, T0, T0 + 1, "ncclCommInitRankConfig", H, 4, r, UID, 7))
        for k, color in enumerate((r % 2, r // 2)):
            events.append(NcclCommSplit(pid, pid, T0 + 10 + 20 * k, T0 + 20 + 20 * k, H, 0, color, r, 7,
                                        newcomm=0x7000 + k))
        tp, child = r % 2, 0x20
        events.append(NcclCommBind(pid, pid, T0 + 60, child, 0x7001))
        events.append(NcclP2P(pid, pid, T0 + 61 + r, T0 + 65 + r, "Recv" if tp else "Send", child, 8, 7, 1 - tp,
                              0, 0, 1, 7))
        events.append(NcclGroup(pid, pid, T0 + 60 + r, T0 + 70 + r, 1, 1, 0, 1))
    proc.consume(events)
    maker = SpanMaker({"host.name": f"node{ranks[0]}"}, "otel_ebpf.nccl")
    return [maker.make(rec.name, trace_id=rec.trace_id or random.getrandbits(128),
                       span_id=rec.span_id or random.getrandbits(64), parent_span_id=rec.parent_span_id,
                       start_ns=rec.start_ns, end_ns=rec.end_ns, attributes=dict(rec.attributes))
            for rec in sink.take() if isinstance(rec, SpanRecord)]


def test_a_split_childs_send_recv_ranked_at_the_gateway_join_as_one_group_p2p_per_tp_group() -> None:
    a, b = tp_scatter_spans((0, 1)), tp_scatter_spans((2, 3))
    p2p = [s for s in a + b if s.name in ("ncclSend", "ncclRecv")]
    assert len(p2p) == 4 and all("nccl.rank" not in s.attributes and "nccl.parent.rank" in s.attributes
                                 for s in p2p)
    splits = [s for s in a + b if s.name == "ncclCommSplit"]
    rest = [s for s in a + b if s.name != "ncclCommSplit"]
    out, ctx = joined(rest[:6] + splits + rest[6:])  # node0's before the splits (held), node2's after
    roots = [s for s in out if s.name == "nccl GroupP2P"]
    assert sorted(r.attributes["nccl.comm.id"] for r in roots) == sorted(split_comm_id(WORLD, 1, c) for c in (0, 1))
    assert all(r.attributes["nccl.group.ranks"] == (0, 1) and "nccl.partial" not in r.attributes for r in roots)
    assert all(r.attributes["nccl.p2p.sends"] == 1 for r in roots)
    got = {(s.attributes["nccl.parent.rank"], s.name): (s.attributes["nccl.rank"], s.attributes["nccl.nranks"])
           for s in out if s.name in ("ncclSend", "ncclRecv")}
    assert got == {(0, "ncclSend"): (0, 2), (1, "ncclRecv"): (1, 2), (2, "ncclSend"): (0, 2), (3, "ncclRecv"): (1, 2)}
    for root in roots:  # each rank's group span under the root, its send/recv under the group
        trace = [s for s in out if s.context.trace_id == root.context.trace_id and s is not root]
        groups = {s.context.span_id for s in trace if s.name == "ncclGroup"}
        assert len(trace) == 4 and len(groups) == 2
        assert all(s.parent is not None and s.parent.span_id in (groups if s.name != "ncclGroup"
                                                                  else {root.context.span_id}) for s in trace)
    assert ctx.telemetry.get("otel_ebpf.collective_join.unjoined", reason="split_unresolved") in (None, 0)
