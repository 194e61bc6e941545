"""Split communicators' ranks from every parent rank's ncclCommSplit, driven as PyTorch drives NCCL
(no ncclCommUserRank/ncclCommCount anywhere): the agent-local resolution of processors/nccl/splits.py."""
from __future__ import annotations

from typing import Any

from otel_ebpf.core.events import ProcessExit, SpanRecord
from otel_ebpf.core.ids import collective_root_span_id, split_ranks
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.nccl import Config, NcclProcessor
from otel_ebpf.processors.nccl.comms import comm_id_from_split, comm_id_from_unique_id
from otel_ebpf.core.telemetry import DROPPED
from otel_ebpf.receivers.nccl.events import NcclCollective, NcclCommBind, NcclCommInit, NcclCommSplit

UID = bytes(range(128))
WORLD = comm_id_from_unique_id(UID, 0)
H = 0x5000
IN_PROGRESS = 7


def split(rank: int, color: int, key: int, child: int, parent: int = H, rc: int = 0, t: int = 3_000) -> NcclCommSplit:
    return NcclCommSplit(100 + rank, 100 + rank, t, t + 10, parent, child, color, key, rc)


def coll(rank: int, seq: int, handle: int, t: int = 10_000) -> NcclCollective:
    return NcclCollective(100 + rank, 100 + rank, t, t + 50, "AllReduce", handle, 8, 7, 0, None, 0, seq, 0, 0)


class Agent:
    """One agent's NCCL processor, seeing the processes of ``ranks`` of a world of ``world``."""

    def __init__(self, ranks: range | tuple[int, ...] = range(4), world: int = 4, init_rc: int = 0,
                 **config: Any) -> None:
        self.ctx = Context()
        self.sink = ListConsumer()
        self.proc = NcclProcessor(Config(host="node", **config), self.ctx, self.sink)
        self.feed(*(NcclCommInit(100 + r, 100 + r, 1_000, 2_000, "ncclCommInitRankConfig", H, world, r, UID, init_rc)
                    for r in ranks))

    def feed(self, *events: object) -> list[SpanRecord]:
        self.proc.consume(list(events))
        return [r for r in self.sink.take() if isinstance(r, SpanRecord)]

    def unjoined(self, reason: str) -> int:
        return int(self.ctx.telemetry.get("otel_ebpf.nccl.unjoined", reason=reason) or 0)


def ranks_of(spans: list[SpanRecord], name: str = "ncclAllReduce") -> dict[int, tuple[int, int]]:
    return {s.pid - 100: (s.attributes["nccl.rank"], s.attributes["nccl.nranks"])
            for s in spans if s.name == name}


def test_split_ranks_order_by_key_then_parent_rank_as_nccl_commGetSplitInfo() -> None:
    # new_group([3, 1]): torch's key is the group rank; 0 and 2 take part with NOCOLOR
    assert split_ranks({0: (-1, 0), 1: (0, 0), 2: (-1, 0), 3: (0, 1)}) == {1: (0, 2), 3: (1, 2)}
    # keys reversing the parent order, and equal keys falling back to parent order
    assert split_ranks({0: (5, 9), 1: (5, 1), 2: (5, 1)}) == {1: (0, 3), 2: (1, 3), 0: (2, 3)}
    assert split_ranks({0: (0, 0), 1: (1, 0), 2: (0, 0), 3: (1, 0)}) == {0: (0, 2), 2: (1, 2), 1: (0, 2), 3: (1, 2)}


def test_new_group_subset_ranks_come_from_every_parent_ranks_split_and_early_calls_are_held() -> None:
    agent = Agent()
    child = comm_id_from_split(WORLD, 0, 0)
    agent.feed(split(0, -1, 0, 0), split(1, 0, 0, 0x10), split(3, 0, 1, 0x30))
    # global rank 3 is fast: its first collective on the child is read before rank 2's split record
    assert agent.feed(coll(3, 0, 0x30)) == [] and agent.proc.splits.held == 1
    spans = agent.feed(split(2, -1, 0, 0), coll(1, 0, 0x10))
    assert ranks_of(spans) == {3: (1, 2), 1: (0, 2)}
    (root,) = [s for s in spans if s.name == "nccl AllReduce"]
    assert root.pid == 101 and root.span_id == collective_root_span_id(child, 0)
    assert all(s.parent_span_id == root.span_id for s in spans if s.name == "ncclAllReduce")
    (nocolor,) = [s for s in spans if s.name == "ncclCommSplit"]
    assert "nccl.comm.id" not in nocolor.attributes and nocolor.attributes["nccl.split.color"] == -1
    assert agent.proc.splits.held == 0 and agent.unjoined("no_rank") == agent.unjoined("split_unresolved") == 0


def test_two_colors_with_keys_and_a_nested_split_of_a_split() -> None:
    agent = Agent()
    # a 2x2 mesh's dimension: colors by row, keys reversing the parent order within a row
    agent.feed(split(0, 0, 1, 0x10), split(1, 0, 0, 0x11), split(2, 1, 1, 0x12), split(3, 1, 0, 0x13))
    assert ranks_of(agent.feed(*(coll(r, 0, 0x10 + r) for r in range(4)))) == {
        0: (1, 2), 1: (0, 2), 2: (1, 2), 3: (0, 2)}
    # split of the child of color 0 (ranks 0, 1): the child's ranks, now known, are the new parent ranks
    spans = agent.feed(split(0, 7, 0, 0x40, parent=0x10), split(1, 7, 0, 0x41, parent=0x11),
                       coll(0, 0, 0x40), coll(1, 0, 0x41))
    assert ranks_of(spans) == {0: (1, 2), 1: (0, 2)}  # child rank 1 -> grandchild rank 1 (equal keys)
    (s,) = [s for s in spans if s.name == "ncclCommSplit" and s.pid == 100]
    assert s.attributes["nccl.parent.rank"] == 1 and s.attributes["nccl.parent.nranks"] == 2
    assert s.attributes["nccl.comm.id"] == comm_id_from_split(comm_id_from_split(WORLD, 0, 0), 0, 7)


def nb_split(rank: int, color: int, key: int, newcomm: int, t: int) -> NcclCommSplit:
    """A non-blocking split's return: ``*newcomm`` still NULL, ``newcomm`` the caller's out-parameter."""
    return NcclCommSplit(100 + rank, 100 + rank, t, t + 10, H, 0, color, key, 0, newcomm)


def bind(rank: int, handle: int, newcomm: int) -> NcclCommBind:
    return NcclCommBind(100 + rank, 100 + rank, 9_000, handle, newcomm)


def test_non_blocking_children_are_bound_by_their_newcomm_address_whatever_order_they_are_used_in() -> None:
    # TORCH_NCCL_USE_COMM_NONBLOCKING=1 on NCCL 2.28.9: ncclCommInitRankConfig returns ncclInProgress with
    # *newcomm already set (src/init.cc ncclCommInitRankDev); ncclCommSplit returns ncclSuccess with *newcomm
    # still NULL (ncclCommInitChildComm), stored later by NCCL's thread. torch 2.11 passes &comm->ncclComm_ of
    # each child's own NCCLComm (NCCLUtils.cpp NCCLComm::split). A (dp, tp) DeviceMesh makes dp's child, then
    # tp's, and tensor parallel uses tp's first: the BPF program names the exact child (NcclCommBind).
    agent = Agent(init_rc=IN_PROGRESS)
    # new_group([1, 3]): ranks 0 and 2 take part with NCCL_SPLIT_NOCOLOR, no child to wait for
    agent.feed(*(split(r, 0 if r % 2 else -1, r // 2, 0) for r in range(4)))
    dp_at, tp_at = {r: 0xD000 + 16 * r for r in range(4)}, {r: 0xE000 + 16 * r for r in range(4)}
    agent.feed(*(nb_split(r, r % 2, r, dp_at[r], 4_000) for r in range(4)),   # dp: {0, 2}, {1, 3}
               *(nb_split(r, r // 2, r, tp_at[r], 5_000) for r in range(4)))  # tp: {0, 1}, {2, 3}
    tp = agent.feed(*(e for r in range(4) for e in (bind(r, 0x90 + r, tp_at[r]), coll(r, 0, 0x90 + r, t=20_000))))
    dp = agent.feed(*(e for r in range(4) for e in (bind(r, 0x80 + r, dp_at[r]), coll(r, 0, 0x80 + r, t=30_000))))
    assert ranks_of(tp) == {0: (0, 2), 1: (1, 2), 2: (0, 2), 3: (1, 2)}
    assert {s.pid - 100: s.attributes["nccl.comm.id"] for s in tp if s.name == "ncclAllReduce"} == {
        r: comm_id_from_split(WORLD, 2, r // 2) for r in range(4)}
    assert ranks_of(dp) == {0: (0, 2), 1: (0, 2), 2: (1, 2), 3: (1, 2)}
    assert {s.pid - 100: s.attributes["nccl.comm.id"] for s in dp if s.name == "ncclAllReduce"} == {
        r: comm_id_from_split(WORLD, 1, r % 2) for r in range(4)}
    assert agent.unjoined("unknown_comm") == agent.unjoined("no_rank") == agent.unjoined("split_unresolved") == 0


def test_a_call_on_a_handle_no_child_was_published_at_is_not_given_a_pending_childs_identity() -> None:
    agent = Agent(init_rc=IN_PROGRESS)
    agent.feed(*(nb_split(r, 0, r, 0xD000 + r, 4_000) for r in range(4)))
    # no NcclCommBind came (the BPF program found no pending address holding 0x99): the call stays unknown
    (call,) = [s for s in agent.feed(coll(0, 0, 0x99)) if s.name == "ncclAllReduce"]
    assert "nccl.comm.id" not in call.attributes and agent.unjoined("unknown_comm") == 1
    # a bind for an address no split of this process passed is counted, not guessed
    agent.feed(bind(1, 0x98, 0xBAD))
    assert agent.ctx.telemetry.get(DROPPED, receiver="nccl", reason="bind_without_split") == 1
    assert "nccl.comm.id" not in agent.feed(coll(1, 0, 0x98))[0].attributes
    # the child still waits at its own address, and a process's exit forgets its children
    assert ranks_of(agent.feed(bind(2, 0x92, 0xD002), coll(2, 0, 0x92))) == {2: (2, 4)}
    agent.proc.consume([ProcessExit(103, 103, 40_000, "nccl")])
    assert agent.proc.splits.bind(103, 0xD003) is None and agent.proc.splits.bind(100, 0xD000) is not None


def test_held_calls_are_bounded_timed_and_freed_at_exit_carrying_the_parent_rank() -> None:
    agent = Agent(max_held_calls=1, split_wait=1e-6)
    agent.feed(split(0, 0, 0, 0x10), split(1, 0, 0, 0x11))
    # beyond the bound: the oldest go out unresolved (the gateway can still resolve them)
    spans = agent.feed(coll(0, 0, 0x10), coll(0, 1, 0x10))
    assert [s.attributes["nccl.parent.rank"] for s in spans] == [0, 0] and "nccl.rank" not in spans[0].attributes
    assert agent.unjoined("split_unresolved") == 2 and agent.unjoined("rank_at_gateway") == 2
    # older than split_wait (event time): released by the next event's clock
    agent2 = Agent(split_wait=1e-6)
    agent2.feed(split(0, 0, 0, 0x10))
    assert agent2.feed(coll(0, 0, 0x10, t=10_000)) == []
    assert [s.start_ns for s in agent2.feed(coll(0, 1, 0x10, t=20_000))] == [10_000]  # the new one waits
    # a process that exits frees its held calls, and shutdown emits what is left
    agent3 = Agent()
    agent3.feed(split(0, 0, 0, 0x10), split(1, 0, 0, 0x11), coll(0, 0, 0x10), coll(1, 0, 0x11))
    agent3.proc.consume([ProcessExit(100, 100, 30_000, "nccl")])
    assert [s.pid for s in agent3.sink.take() if isinstance(s, SpanRecord)] == [100]
    agent3.proc.shutdown()
    assert [s.pid for s in agent3.sink.take() if isinstance(s, SpanRecord)] == [101]


def test_an_agent_that_sees_part_of_the_parent_emits_at_once_with_what_the_gateway_needs() -> None:
    agent = Agent(ranks=(0, 1))
    (sp,) = agent.feed(split(1, 0, 5, 0x11))
    assert {k: sp.attributes[k] for k in ("nccl.parent.comm.id", "nccl.split.seq", "nccl.parent.rank",
                                          "nccl.parent.nranks", "nccl.split.color", "nccl.split.key")} == {
        "nccl.parent.comm.id": WORLD, "nccl.split.seq": 0, "nccl.parent.rank": 1, "nccl.parent.nranks": 4,
        "nccl.split.color": 0, "nccl.split.key": 5}
    (span,) = agent.feed(coll(1, 0, 0x11))
    assert span.attributes["nccl.parent.rank"] == 1 and "nccl.rank" not in span.attributes
