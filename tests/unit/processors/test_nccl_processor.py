"""The NCCL processor: typed events in, spans/metrics with cross-rank join ids out."""
from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_ebpf.core.config import build
from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.core.errors import ConfigError
from otel_ebpf.core.ids import derive_id
from otel_ebpf.core.events import LibraryLoaded, MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.nccl import Config, NcclProcessor, factory
from otel_ebpf.processors.nccl.comms import (
    comm_id_from_init_all,
    comm_id_from_split,
    comm_id_from_unique_id,
    p2p_ids,
)
from otel_ebpf.receivers.nccl import Config as ReceiverConfig
from otel_ebpf.receivers.nccl.events import (
    DATATYPES,
    NcclCollective,
    NcclCommEnd,
    NcclCommInfo,
    NcclCommInit,
    NcclCommInitAll,
    NcclCommSplit,
    NcclGroup,
    NcclP2P,
)
from otel_ebpf.core.telemetry import DROPPED

UID = bytes(range(128))
PIDS = (100, 101, 102)
HANDLE = 0x5000


def init(pid: int, rank: int, nranks: int = 3, handle: int = HANDLE, uid: bytes = UID, rc: int = 0,
         function: str = "ncclCommInitRank") -> NcclCommInit:
    return NcclCommInit(pid, pid, 1_000, 2_000, function, handle if rc == 0 else 0, nranks, rank, uid, rc)


def coll(pid: int, seq: int | None, *, op: str = "AllReduce", handle: int = HANDLE, count: int = 1024,
         datatype: int = 7, redop: int | None = 0, root: int | None = None, group: int = 0, rc: int = 0,
         start: int = 10_000) -> NcclCollective:
    return NcclCollective(pid, pid, start, start + 500, op, handle, count, datatype, redop, root, 0xabc,
                          seq, group, rc)


def p2p(pid: int, op: str, peer: int, seq: int, group: int = 0) -> NcclP2P:
    return NcclP2P(pid, pid, 20_000, 20_100, op, HANDLE, 10, 2, peer, 0, seq, group, 0)


class Harness:
    def __init__(self, **config: Any) -> None:
        self.ctx = Context()
        self.sink = ListConsumer()
        self.proc = NcclProcessor(Config(**config), self.ctx, self.sink)
        self.proc.start()

    def feed(self, *events: object) -> list[object]:
        self.proc.consume(list(events))
        return self.sink.take()

    def spans(self, *events: object) -> list[SpanRecord]:
        return [r for r in self.feed(*events) if isinstance(r, SpanRecord)]


def three_ranks() -> Harness:
    h = Harness(host="node-a")
    h.feed(*(init(pid, rank) for rank, pid in enumerate(PIDS)))
    return h


def by_name(spans: list[SpanRecord], name: str) -> list[SpanRecord]:
    return [s for s in spans if s.name == name]


def test_factory_is_registered_under_nccl_and_lifecycle_is_idempotent() -> None:
    assert factory.type == "nccl" and factory.config_class is Config
    proc = factory.create(Config(), Context(), ListConsumer())
    proc.shutdown()
    proc.start()
    proc.shutdown()
    proc.shutdown()


@pytest.mark.parametrize(("cls", "prefix", "key", "value"), [
    (Config, "processors.nccl", "max_comms", 0),
    (ReceiverConfig, "receivers.nccl", "ringbuf_pages", 3),
    (ReceiverConfig, "receivers.nccl", "max_p2p_counters", 0),
    (ReceiverConfig, "receivers.nccl", "max_comm", 1),  # unknown key
])
def test_nccl_configs_name_the_bad_key(cls: type, prefix: str, key: str, value: int) -> None:
    with pytest.raises(ConfigError) as err:
        build(cls, {key: value}, prefix)
    assert err.value.path == f"{prefix}.{key}"
    assert build(cls, {}, prefix) == cls()


def test_every_rank_of_a_collective_gets_the_same_trace_and_parent_and_rank0_emits_the_root() -> None:
    h = three_ranks()
    spans = h.spans(*(coll(pid, 0) for pid in PIDS))
    comm_id = comm_id_from_unique_id(UID, 0)
    members = by_name(spans, "ncclAllReduce")
    assert len(members) == 3
    trace, root = derive_id(comm_id, 0), derive_id(comm_id, 0, "collective", bits=64)
    for rank, span in enumerate(members):
        assert span.trace_id == trace and span.parent_span_id == root
        assert span.span_id == derive_id(comm_id, 0, rank, bits=64)
        assert span.attributes["nccl.comm.id"] == comm_id and span.attributes["nccl.rank"] == rank
        assert span.attributes["nccl.nranks"] == 3 and span.attributes["nccl.seq"] == 0
        assert span.attributes["nccl.timing"] == "host_enqueue"
        assert span.attributes["nccl.redop"] == "sum" and "nccl.root" not in span.attributes
    (top,) = by_name(spans, "nccl AllReduce")
    assert top.pid == PIDS[0] and top.span_id == root and top.trace_id == trace
    assert top.parent_span_id is None and top.start_ns == members[0].start_ns


@pytest.mark.parametrize("code", sorted(DATATYPES))
def test_bytes_are_count_times_the_datatype_size(code: int) -> None:
    h = three_ranks()
    (span,) = by_name(h.spans(coll(PIDS[1], 0, count=10, datatype=code)), "ncclAllReduce")
    name, size = DATATYPES[code]
    assert span.attributes["nccl.datatype"] == name and span.attributes["nccl.bytes"] == 10 * size


def test_an_unknown_datatype_has_no_bytes() -> None:
    h = three_ranks()
    (span,) = by_name(h.spans(coll(PIDS[1], 0, datatype=99)), "ncclAllReduce")
    assert span.attributes["nccl.datatype"] == "unknown(99)" and "nccl.bytes" not in span.attributes


@pytest.mark.parametrize(("rc", "name"), [(4, "ncclInvalidArgument"), (1, "ncclUnhandledCudaError"),
                                          (42, "ncclResult(42)")])
def test_a_failed_call_has_error_status_with_the_result_name_and_is_not_joined(rc: int, name: str) -> None:
    h = three_ranks()
    out = h.feed(coll(PIDS[0], None, rc=rc))
    (span,) = [r for r in out if isinstance(r, SpanRecord)]
    assert span.error == name and span.trace_id is None and span.parent_span_id is None
    errors = [m for m in out if isinstance(m, MetricRecord) and m.name == "nccl.errors"]
    assert errors[0].attributes == {"nccl.function": "ncclAllReduce", "nccl.error": name}


def test_in_progress_is_not_an_error() -> None:
    h = three_ranks()
    (span,) = by_name(h.spans(coll(PIDS[0], 0, rc=7)), "ncclAllReduce")
    assert span.error is None and span.trace_id is not None


def test_rooted_ops_carry_root_and_no_redop() -> None:
    h = three_ranks()
    (span,) = h.spans(coll(PIDS[2], 3, op="Broadcast", redop=None, root=1, datatype=6, count=256))
    assert span.name == "ncclBroadcast" and span.attributes["nccl.root"] == 1
    assert "nccl.redop" not in span.attributes and span.attributes["nccl.bytes"] == 512


def test_repeated_inits_of_one_unique_id_get_distinct_ids_all_ranks_agree_on() -> None:
    h = Harness()
    h.feed(init(100, 0, 2, handle=1), init(101, 1, 2, handle=7), init(100, 0, 2, handle=2),
           init(101, 1, 2, handle=8))
    first, second = comm_id_from_unique_id(UID, 0), comm_id_from_unique_id(UID, 1)
    assert first != second
    assert h.proc.comms.get(100, 1).comm_id == h.proc.comms.get(101, 7).comm_id == first
    assert h.proc.comms.get(100, 2).comm_id == h.proc.comms.get(101, 8).comm_id == second


def test_a_failed_init_creates_no_communicator_and_is_an_error_span() -> None:
    h = Harness()
    (span,) = h.spans(init(100, 0, rc=2))
    assert span.error == "ncclSystemError" and "nccl.comm.id" not in span.attributes
    assert len(h.proc.comms) == 0


def test_split_children_ids_follow_parent_counter_and_color_nocolor_included() -> None:
    h = three_ranks()
    parent = comm_id_from_unique_id(UID, 0)
    # first split: ranks 0 and 2 color 0, rank 1 opts out (NCCL_SPLIT_NOCOLOR, no child)
    h.feed(NcclCommSplit(100, 100, 1, 2, HANDLE, 0x10, 0, 0, 0),
           NcclCommSplit(101, 101, 1, 2, HANDLE, 0, -1, 1, 0),
           NcclCommSplit(102, 102, 1, 2, HANDLE, 0x10, 0, 2, 0))
    assert h.proc.comms.get(100, 0x10).comm_id == h.proc.comms.get(102, 0x10).comm_id \
        == comm_id_from_split(parent, 0, 0)
    # second split: everyone color 3; rank 1's counter advanced on its NOCOLOR call too
    h.feed(*(NcclCommSplit(pid, pid, 1, 2, HANDLE, 0x20, 3, 0, 0) for pid in PIDS))
    ids = {h.proc.comms.get(pid, 0x20).comm_id for pid in PIDS}
    assert ids == {comm_id_from_split(parent, 1, 3)}


def test_split_child_rank_is_learned_from_user_rank_then_joined() -> None:
    h = Harness(host="node-a")
    h.feed(init(100, 0))  # ranks 1 and 2 run under another agent: the split cannot be resolved here
    h.feed(NcclCommSplit(100, 100, 1, 2, HANDLE, 0x10, 0, 0, 0))
    child = comm_id_from_split(comm_id_from_unique_id(UID, 0), 0, 0)
    (unranked,) = h.spans(coll(100, 0, handle=0x10))
    assert unranked.trace_id == derive_id(child, 0) and unranked.parent_span_id is None
    assert unranked.attributes["nccl.parent.rank"] == 0  # for the gateway's join
    assert h.ctx.telemetry.get("otel_ebpf.nccl.unjoined", reason="rank_at_gateway") == 1
    h.feed(NcclCommInfo(100, 100, 5, 0x10, "rank", 0, 0), NcclCommInfo(100, 100, 5, 0x10, "nranks", 3, 0),
           NcclCommInfo(100, 100, 5, 0x10, "device", 6, 0))
    spans = h.spans(coll(100, 1, handle=0x10))
    (member,) = by_name(spans, "ncclAllReduce")
    assert member.parent_span_id == derive_id(child, 1, "collective", bits=64)
    assert member.attributes["nccl.rank"] == 0 and member.attributes["nccl.device"] == 6
    assert len(by_name(spans, "nccl AllReduce")) == 1


def test_init_all_communicators_share_one_id_with_rank_by_index() -> None:
    h = Harness(host="node-a")
    h.feed(NcclCommInitAll(100, 100, 1, 2, 3, (11, 12, 13), (4, 5, 6), 0))
    comm_id = comm_id_from_init_all("node-a", 100, 0)
    for rank, (handle, device) in enumerate(((11, 4), (12, 5), (13, 6))):
        c = h.proc.comms.get(100, handle)
        assert (c.comm_id, c.rank, c.nranks, c.device) == (comm_id, rank, 3, device)
    spans = h.spans(*(coll(100, 0, handle=hd) for hd in (11, 12, 13)))
    assert len({s.trace_id for s in spans}) == 1 and len(by_name(spans, "nccl AllReduce")) == 1


def test_send_k_and_matching_recv_k_share_a_trace_and_link_each_other() -> None:
    h = three_ranks()
    send, recv = h.spans(p2p(100, "Send", 1, 4), p2p(101, "Recv", 0, 4))
    trace, send_id, recv_id = p2p_ids(comm_id_from_unique_id(UID, 0), 0, 1, 4)
    assert send.trace_id == recv.trace_id == trace
    assert (send.span_id, recv.span_id) == (send_id, recv_id)
    assert send.links[0].span_id == recv_id and recv.links[0].span_id == send_id
    assert send.attributes["nccl.peer"] == 1 and recv.attributes["nccl.peer"] == 0
    assert send.attributes["nccl.bytes"] == 40 and send.parent_span_id is None


def test_group_members_link_to_the_group_span() -> None:
    h = three_ranks()
    spans = h.spans(p2p(100, "Send", 1, 0, group=9), p2p(100, "Recv", 2, 0, group=9),
                    NcclGroup(100, 100, 19_000, 21_000, 9, 2, 0))
    (group,) = by_name(spans, "ncclGroup")
    assert group.attributes["nccl.group.size"] == 2
    assert (group.start_ns, group.end_ns) == (19_000, 21_000)
    for member in by_name(spans, "ncclSend") + by_name(spans, "ncclRecv"):
        assert member.attributes["nccl.group.id"] == group.attributes["nccl.group.id"]
        assert (group.trace_id, group.span_id) in {(lk.trace_id, lk.span_id) for lk in member.links}


def test_comm_table_is_bounded_and_overflow_is_counted() -> None:
    h = Harness(max_comms=2)
    h.feed(init(100, 0, handle=1), init(100, 0, handle=2, uid=b"\1" * 128),
           init(100, 0, handle=3, uid=b"\2" * 128))
    assert len(h.proc.comms) == 2
    assert h.ctx.telemetry.get(DROPPED, receiver="nccl", reason="comm_table_full") == 1
    assert h.ctx.telemetry.get(DROPPED, receiver="nccl", reason="comm_counters_full") == 1
    (span,) = h.spans(coll(100, 0, handle=3))
    assert span.trace_id is None and "nccl.comm.id" not in span.attributes
    assert h.ctx.telemetry.get("otel_ebpf.nccl.unjoined", reason="unknown_comm") == 1


def test_destroy_and_process_exit_free_communicators() -> None:
    h = three_ranks()
    (span,) = h.spans(NcclCommEnd(100, 100, 1, 2, HANDLE, False, 0))
    assert span.name == "ncclCommDestroy" and span.attributes["nccl.comm.id"]
    assert h.proc.comms.get(100, HANDLE) is None
    exit_ev = ProcessExit(101, 5, "rank", 0)
    assert h.feed(exit_ev) == [exit_ev]
    assert h.proc.comms.get(101, HANDLE) is None and h.proc.comms.get(102, HANDLE) is not None


def test_other_events_pass_unchanged_and_bad_events_are_counted() -> None:
    h = three_ranks()
    other = LibraryLoaded(1, 1, 1, "/x")
    out = h.feed(other, coll(100, 0, count=None), coll(101, 0))  # type: ignore[arg-type]
    assert out[0] is other
    assert len(by_name([r for r in out if isinstance(r, SpanRecord)], "ncclAllReduce")) == 1
    assert h.ctx.telemetry.get(DROPPED, receiver="nccl", reason="bad_event") == 1


def test_metrics_count_calls_and_bytes_per_batch_and_observe_each_duration() -> None:
    h = three_ranks()
    out = h.feed(coll(100, 0), coll(100, 1), coll(100, 2, datatype=2))
    metrics = [m for m in out if isinstance(m, MetricRecord)]
    calls = {m.attributes["nccl.datatype"]: m.value for m in metrics if m.name == "nccl.calls"}
    assert calls == {"float32": 2, "int32": 1}
    sizes = {m.attributes["nccl.datatype"]: m.value for m in metrics if m.name == "nccl.bytes"}
    assert sizes == {"float32": 2 * 4096, "int32": 4096}
    durations = [m for m in metrics if m.name == "nccl.enqueue.duration"]
    assert len(durations) == 3 and durations[0].unit == "s" and durations[0].value == pytest.approx(5e-7)


# ---- through the SDK emitter ---------------------------------------------------------------

class _NoMetrics(MetricExporter):
    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def test_emitted_otel_spans_carry_the_derived_ids_links_and_attributes() -> None:
    exporter = InMemorySpanExporter()
    ctx = Context()
    emitter = Emitter([ExporterSpec("mem", exporter, _NoMetrics(), batch_delay=0.01)], ctx.telemetry,
                      resource_of=lambda pid, comm: {"process.pid": pid},
                      agent_attributes={"service.name": "otel-ebpf"})
    proc = NcclProcessor(Config(host="node-a"), ctx, emitter)
    proc.consume([init(pid, rank) for rank, pid in enumerate(PIDS)])
    proc.consume([coll(pid, 0) for pid in PIDS] + [coll(100, None, rc=4)]
                 + [p2p(100, "Send", 1, 0, group=3), p2p(101, "Recv", 0, 0),
                    NcclGroup(100, 100, 19_000, 21_000, 3, 1, 0)])
    emitter.flush()
    spans = exporter.get_finished_spans()
    emitter.shutdown()
    comm_id = comm_id_from_unique_id(UID, 0)
    trace, root = derive_id(comm_id, 0), derive_id(comm_id, 0, "collective", bits=64)
    members = [s for s in spans if s.name == "ncclAllReduce" and s.status.status_code != StatusCode.ERROR]
    assert sorted(s.attributes["nccl.rank"] for s in members) == [0, 1, 2]
    for s in members:
        assert s.context.trace_id == trace and s.parent.span_id == root
        assert s.context.span_id == derive_id(comm_id, 0, s.attributes["nccl.rank"], bits=64)
        assert s.resource.attributes["process.pid"] == PIDS[s.attributes["nccl.rank"]]
        assert s.attributes["nccl.bytes"] == 4096 and s.attributes["nccl.datatype"] == "float32"
    (top,) = [s for s in spans if s.name == "nccl AllReduce"]
    assert top.context.trace_id == trace and top.context.span_id == root and top.parent is None
    (failed,) = [s for s in spans if s.status.status_code == StatusCode.ERROR]
    assert failed.status.description == "ncclInvalidArgument" and failed.context.trace_id != trace
    (send,) = [s for s in spans if s.name == "ncclSend"]
    (recv,) = [s for s in spans if s.name == "ncclRecv"]
    (group,) = [s for s in spans if s.name == "ncclGroup"]
    assert send.context.trace_id == recv.context.trace_id
    assert {lk.context.span_id for lk in send.links} == {recv.context.span_id, group.context.span_id}
    assert recv.links[0].context.span_id == send.context.span_id
    assert group.attributes["nccl.group.size"] == 1


def test_only_the_nccl_receivers_exit_record_frees_communicators() -> None:
    """The CUDA receiver's exit record of a rank can overtake the NCCL receiver's last records
    of it; freeing the communicators then would strip the last collectives of their join ids."""
    h = three_ranks()
    h.feed(ProcessExit(101, 5, "rank", 0, source="cuda"))
    assert h.proc.comms.get(101, HANDLE) is not None
    (span,) = h.spans(coll(101, 0))  # a late record of that rank is still joined
    assert span.trace_id is not None and span.attributes["nccl.comm.id"]
    h.feed(ProcessExit(101, 6, "rank", 0, source="nccl"))
    assert h.proc.comms.get(101, HANDLE) is None


def test_a_call_blocked_while_another_thread_aborts_its_communicator_keeps_its_ids() -> None:
    """PyTorch's watchdog: thread A blocked in ncclAllReduce (a peer died), thread B calls ncclCommAbort on
    that communicator (NCCL 2.28.9 src/init.cc ncclCommAbort), then A's call returns. The abort's record
    comes first; A's call keeps the communicator (and the seq the receiver numbered it with at entry)."""
    h = three_ranks()
    pid, tid_b = PIDS[1], 7777
    assert h.spans(coll(pid, 0, start=10_000))[0].trace_id is not None
    blocked = NcclCollective(pid, pid, 20_000, 15_020_000, "AllReduce", HANDLE, 1024, 7, 0, None, 0xabc, 1, 0, 0)
    (abort,) = h.spans(NcclCommEnd(pid, tid_b, 15_000_000, 15_010_000, HANDLE, True, 0))
    assert abort.name == "ncclCommAbort" and h.proc.comms.get(pid, HANDLE) is None
    (span,) = h.spans(blocked)
    comm_id = comm_id_from_unique_id(UID, 0)
    assert span.attributes["nccl.comm.id"] == comm_id == abort.attributes["nccl.comm.id"]
    assert span.attributes["nccl.seq"] == 1 and span.attributes["nccl.rank"] == 1
    assert span.trace_id == derive_id(comm_id, 1)
    assert h.ctx.telemetry.get("otel_ebpf.nccl.unjoined", reason="unknown_comm") == 0
    # a new communicator on the reused handle: its calls (entered after the abort) are its own
    h.feed(NcclCommInit(pid, pid, 16_000_000, 16_001_000, "ncclCommInitRank", HANDLE, 2, 0, bytes(128), 0))
    (new,) = by_name(h.spans(coll(pid, 0, start=17_000_000)), "ncclAllReduce")
    assert new.attributes["nccl.comm.id"] == comm_id_from_unique_id(bytes(128), 0)
    assert new.attributes["nccl.rank"] == 0
    # a call that entered after the abort, on no communicator, is unknown; the process's exit forgets the ended
    h.feed(NcclCommEnd(pid, pid, 18_000_000, 18_001_000, HANDLE, False, 0))
    (late,) = h.spans(coll(pid, 1, start=19_000_000))
    assert "nccl.comm.id" not in late.attributes
    h.feed(ProcessExit(pid, 5, "rank", 0))
    assert h.proc.comms.for_call(pid, HANDLE, 0) is None


def test_ended_communicators_kept_for_blocked_calls_are_bounded() -> None:
    h = Harness(host="node-a", max_comms=2)
    for pid in (100, 101, 102):
        h.feed(init(pid, 0, handle=HANDLE), NcclCommEnd(pid, pid, 3_000, 4_000, HANDLE, True, 0))
    assert h.proc.comms.for_call(100, HANDLE, 2_500) is None  # the oldest end forgotten
    assert h.proc.comms.for_call(102, HANDLE, 2_500) is not None
    assert h.proc.comms.for_call(102, HANDLE, 4_001) is None  # entered after the end


class _Threads:
    """core.services.CudaThreads as the cuda receiver answers: set devices per (pid, tid), None elsewhere."""

    def __init__(self, devices: dict[tuple[int, int], int]) -> None:
        self.devices = devices

    def device_of(self, pid: int, tid: int) -> int | None:
        return self.devices.get((pid, tid))


def test_a_communicator_takes_the_device_of_the_thread_that_made_it_and_children_inherit_it() -> None:
    h = Harness(host="node-a")
    # rank 0 never set a device (the receiver answers CUDA's default, 0); rank 1 is on 1; rank 2's CUDA runtime
    # is not probed (None): its communicator's device stays unknown
    h.ctx.cuda_threads = _Threads({(100, 100): 0, (101, 101): 1})
    inits = h.spans(*(init(pid, rank) for rank, pid in enumerate(PIDS)))
    assert [s.attributes.get("nccl.device") for s in inits] == [0, 1, None]
    assert [h.proc.comms.get(pid, HANDLE).device for pid in PIDS] == [0, 1, None]
    spans = h.spans(*(coll(pid, 0) for pid in PIDS))
    assert sorted((s.pid, s.attributes.get("nccl.device")) for s in by_name(spans, "ncclAllReduce")) == [
        (100, 0), (101, 1), (102, None)]
    # NCCL's split runs on the parent's device (src/init.cc ncclCommInitChildComm: cudaSetDevice(comm->cudaDev))
    h.ctx.cuda_threads = _Threads({(101, 101): 5})  # the thread moved since: the child keeps the parent's
    h.feed(*(NcclCommSplit(pid, pid, 1, 2, HANDLE, 0x10, 0, rank, 0) for rank, pid in enumerate(PIDS)))
    assert [h.proc.comms.get(pid, 0x10).device for pid in PIDS] == [0, 1, None]
