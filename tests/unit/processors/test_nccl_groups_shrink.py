"""The NCCL processor on the call sequences PyTorch 2.11 makes for simulated groups (``_time_estimator``:
ncclGroupStart, the collectives, ncclGroupSimulateEnd) and ``shrink_group`` (ncclCommShrink)."""
from __future__ import annotations

from otel_ebpf.core.events import MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.core.ids import collective_ids
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.core.telemetry import DROPPED
from otel_ebpf.processors.nccl import Config, NcclProcessor
from otel_ebpf.processors.nccl.comms import comm_id_from_unique_id
from otel_ebpf.receivers.nccl.events import (
    NcclCollective,
    NcclCommBind,
    NcclCommInit,
    NcclCommShrink,
    NcclGroup,
    NcclP2P,
)

UID = bytes(range(128))
WORLD = 0x5000


def init(pid: int, rank: int, nranks: int) -> NcclCommInit:
    return NcclCommInit(pid, pid, 1_000, 2_000, "ncclCommInitRankConfig", WORLD, nranks, rank, UID, 0)


def coll(pid: int, seq: int, handle: int = WORLD, group: int = 0, start: int = 10_000) -> NcclCollective:
    return NcclCollective(pid, pid, start, start + 500, "AllReduce", handle, 256, 7, 0, None, 0, seq, group, 0)


def group(pid: int, gid: int, members: int, p2p: int = 0, simulated: bool = False, rc: int = 0) -> NcclGroup:
    return NcclGroup(pid, pid, 9_000, 12_000, gid, members, rc, p2p, simulated)


class Harness:
    def __init__(self, **config: object) -> None:
        self.ctx = Context()
        self.sink = ListConsumer()
        self.proc = NcclProcessor(Config(host="node-a", **config), self.ctx, self.sink)  # type: ignore[arg-type]

    def feed(self, *events: object) -> list[object]:
        self.proc.consume(list(events))
        return self.sink.take()

    def spans(self, *events: object) -> list[SpanRecord]:
        return [r for r in self.feed(*events) if isinstance(r, SpanRecord)]


def calls_metric(records: list[object]) -> float:
    return sum(m.value for m in records if isinstance(m, MetricRecord) and m.name == "nccl.calls")


def test_a_simulated_group_is_marked_not_counted_and_gives_its_numbers_back() -> None:
    h = Harness()
    h.feed(init(100, 0, 2), init(101, 1, 2))
    # rank 0 estimates (its AllReduce took kernel seq 0 and launched nothing), then both ranks run one
    held = h.feed(coll(100, 0, group=7))
    assert not [r for r in held if isinstance(r, SpanRecord)]  # held until the group's end
    out = h.feed(group(100, 7, 1, simulated=True))
    sim = [s for s in out if isinstance(s, SpanRecord)]
    assert {s.name for s in sim} == {"ncclAllReduce", "ncclGroup"}
    assert all(s.attributes["nccl.simulated"] is True for s in sim)
    member = next(s for s in sim if s.name == "ncclAllReduce")
    assert member.trace_id is None and "nccl.seq" not in member.attributes
    assert calls_metric(out) == 0
    out = h.feed(coll(100, 1, start=20_000), coll(101, 0, start=20_000))
    real = [s for s in out if isinstance(s, SpanRecord) and s.name == "ncclAllReduce"]
    comm = comm_id_from_unique_id(UID, 0)
    assert {s.attributes["nccl.seq"] for s in real} == {0}
    assert {s.trace_id for s in real} == {collective_ids(comm, 0, 0)[0]}
    assert "nccl.simulated" not in real[0].attributes
    assert calls_metric(out) == 2
    assert h.ctx.telemetry.get("otel_ebpf.nccl.unjoined", reason="no_seq") == 0


def test_a_group_ended_by_ncclGroupEnd_emits_its_members_joined_and_counts_its_p2p() -> None:
    h = Harness()
    h.feed(init(100, 0, 2))
    send = NcclP2P(100, 100, 10_000, 10_100, "Send", WORLD, 4, 7, 1, 0, 0, 3, 0)
    out = h.spans(coll(100, 0, group=3), send, group(100, 3, 2, p2p=1))
    assert {s.name for s in out} >= {"ncclAllReduce", "ncclSend", "ncclGroup"}
    g = next(s for s in out if s.name == "ncclGroup")
    assert g.attributes["nccl.group.p2p"] == 1 and "nccl.simulated" not in g.attributes
    assert next(s for s in out if s.name == "ncclSend").trace_id is not None


def test_members_of_a_group_that_never_ends_are_released_at_exit_and_the_bound_is_counted() -> None:
    h = Harness(max_held_calls=1)
    h.feed(init(100, 0, 1))
    assert not h.spans(coll(100, 0, group=5))
    (second,) = [s for s in h.spans(coll(100, 1, group=5)) if s.name == "ncclAllReduce"]  # beyond the bound
    assert second.attributes["nccl.seq"] == 1
    assert h.ctx.telemetry.get(DROPPED, receiver="nccl", reason="group_calls_full") == 1
    out = h.spans(ProcessExit(100, 0, 0, "nccl"))
    assert [s.attributes["nccl.seq"] for s in out if s.name == "ncclAllReduce"] == [0]


def shrink(pid: int, comm: int, excluded: tuple[int, ...] = (2,), newcomm: int = 0x6000) -> NcclCommShrink:
    return NcclCommShrink(pid, pid, 3_000, 4_000, WORLD, comm, len(excluded), excluded, 0, 0, newcomm)


def test_shrink_children_are_the_parents_ranks_minus_the_excluded_in_order() -> None:
    h = Harness()
    pids = (100, 101, 102, 103)
    h.feed(*(init(pid, rank, 4) for rank, pid in enumerate(pids)))
    spans = h.spans(*(shrink(pid, 0x7000) for pid in (100, 101, 103)))  # rank 2 excluded: it does not call
    assert [(s.attributes["nccl.rank"], s.attributes["nccl.nranks"]) for s in spans] == [(0, 3), (1, 3), (2, 3)]
    child = {s.attributes["nccl.comm.id"] for s in spans}
    assert len(child) == 1
    out = h.spans(*(coll(pid, 0, handle=0x7000) for pid in (100, 101, 103)))
    calls = [s for s in out if s.name == "ncclAllReduce"]
    assert sorted(s.attributes["nccl.rank"] for s in calls) == [0, 1, 2]
    assert {s.trace_id for s in calls} == {collective_ids(child.pop(), 0, 0)[0]}


def test_a_non_blocking_shrink_binds_its_child_by_the_address_it_is_published_at() -> None:
    h = Harness()
    h.feed(init(100, 3, 4))
    (span,) = h.spans(shrink(100, 0, excluded=(0, 1), newcomm=0x6100))  # *newcomm NULL until the child is ready
    (call,) = [s for s in h.spans(NcclCommBind(100, 100, 5_000, 0x9000, 0x6100), coll(100, 0, handle=0x9000))
               if s.name == "ncclAllReduce"]
    assert (call.attributes["nccl.rank"], call.attributes["nccl.nranks"]) == (1, 2)
    assert call.attributes["nccl.comm.id"] == span.attributes["nccl.comm.id"]


def test_captured_calls_keep_their_numbers_are_marked_counted_apart_and_never_joined() -> None:
    """A collective made during a CUDA stream capture (torch.cuda.graph around an all_reduce) is recorded into
    the graph, not run: it keeps its number (every rank captures it), gets no join ids, and counts as captured."""
    import dataclasses

    h = Harness()
    h.feed(init(100, 0, 2))
    out = h.feed(dataclasses.replace(coll(100, 0), captured=True), coll(100, 1, start=20_000))
    spans = [r for r in out if isinstance(r, SpanRecord) and r.name == "ncclAllReduce"]
    captured, ran = sorted(spans, key=lambda s: s.start_ns)
    assert captured.attributes["nccl.captured"] is True and captured.attributes["nccl.seq"] == 0
    assert captured.trace_id is None and captured.span_id is None
    assert "nccl.captured" not in ran.attributes and ran.trace_id == collective_ids(
        ran.attributes["nccl.comm.id"], 1, 0)[0]
    h.proc.shutdown()
    flushed = h.sink.take() + out
    assert calls_metric(flushed) == 1
    assert sum(m.value for m in flushed if isinstance(m, MetricRecord) and m.name == "nccl.captured.calls") == 1
    grp = dataclasses.replace(group(100, 9, 0), captured=True)
    (g,) = [s for s in h.spans(grp) if s.name == "ncclGroup"]
    assert g.attributes["nccl.captured"] is True
