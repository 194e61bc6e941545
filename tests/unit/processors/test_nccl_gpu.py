"""The NCCL processor's GPU spans from the profiler plugin's records (processors/nccl/gpu.py): matched to their
host call by the CollApi/P2pApi handle in either order, parented on the host span, bandwidth as nccl-tests
computes it, full tables counted; a process whose NCCL the uprobes do not see gets spans from the plugin alone."""
from __future__ import annotations

import pytest

from otel_ebpf.core.events import MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.core.ids import collective_ids
from otel_ebpf.core.telemetry import DROPPED
from otel_ebpf.processors.nccl.comms import comm_id_from_unique_id
from otel_ebpf.processors.nccl.gpu import MAX_CLOCK_SKEW_NS, MAX_GPU_DURATION_NS, GpuBook, HostCall, bus_factor
from otel_ebpf.receivers.nccl.events import NcclCollective, NcclP2P, NcclProfColl, NcclProfComm, NcclProfP2P
from tests.unit.processors.test_nccl_processor import HANDLE, PIDS, UID, Harness, init

T0 = 1_800_000_000_000_000_000  # epoch ns: the GPU clock reads the same epoch
CTX, API, OP = 0x11, 0x21, 0x31


def host(pid: int, seq: int, api: int = API, op: str = "AllReduce", count: int = 1 << 20) -> NcclCollective:
    return NcclCollective(pid, pid, T0, T0 + 20_000, op, HANDLE, count, 7, 0, None, 0xabc, seq, 0, 0, False, api)


def gpu(pid: int, seq: int = 0, handle: int = OP, api: int = API, func: str = "AllReduce",
        start: int = T0 + 30_000, dur: int = 4_000_000) -> NcclProfColl:
    """The plugin's record of a collective whose 4 kernel channels ran from ``start`` for ``dur`` ns."""
    return NcclProfColl(pid, pid, T0 + 10_000, handle, CTX, 0x41, api, seq, func, 1 << 20, "ncclFloat32", 0,
                        "RING", "SIMPLE", 4, 16, start, start + dur, 4)


def comm(pid: int, rank: int) -> NcclProfComm:
    return NcclProfComm(pid, pid, T0, CTX, 0xfeedbeef, rank, 3, 1, "", 1)


def ranks() -> Harness:
    h = Harness(host="node-a")
    h.feed(*(init(pid, rank) for rank, pid in enumerate(PIDS)))
    h.feed(*(comm(pid, rank) for rank, pid in enumerate(PIDS)))
    return h


def test_the_gpu_span_is_the_child_of_its_host_span_with_nccl_figures() -> None:
    h = ranks()
    pid = PIDS[1]
    out = h.feed(host(pid, 0))
    host_span = next(s for s in out if isinstance(s, SpanRecord) and s.name == "ncclAllReduce")
    assert not any(isinstance(s, SpanRecord) and s.name.endswith(" gpu") for s in out)  # its kernel still runs
    out = h.feed(gpu(pid))
    (g,) = [s for s in out if isinstance(s, SpanRecord)]
    cid = comm_id_from_unique_id(UID, 0)
    trace, _, own = collective_ids(cid, 0, 1)
    assert (g.name, g.trace_id, g.parent_span_id) == ("ncclAllReduce gpu", trace, own)
    assert host_span.span_id == own
    assert (g.start_ns, g.end_ns) == (T0 + 30_000, T0 + 30_000 + 4_000_000)
    a = g.attributes
    assert a["nccl.timing"] == "gpu" and host_span.attributes["nccl.timing"] == "host_enqueue"
    assert (a["nccl.algo"], a["nccl.proto"], a["nccl.nchannels"], a["nccl.gpu.seq"]) == ("RING", "SIMPLE", 4, 0)
    assert (a["nccl.rank"], a["nccl.seq"], a["nccl.comm.id"], a["nccl.comm.hash"]) == (1, 0, cid, "00000000feedbeef")
    assert a["nccl.gpu.duration_ns"] == 4_000_000
    nbytes = (1 << 20) * 4  # float32
    assert a["nccl.algbw"] == pytest.approx(nbytes / 4e-3)
    assert a["nccl.busbw"] == pytest.approx(nbytes / 4e-3 * 2 * 2 / 3)
    (m,) = [r for r in out if isinstance(r, MetricRecord)]
    assert (m.name, m.value, m.attributes["nccl.algo"]) == ("nccl.gpu.duration", pytest.approx(4e-3), "RING")


def test_a_gpu_time_that_comes_before_its_host_call_waits_for_it() -> None:
    h = ranks()
    pid = PIDS[0]
    assert not [s for s in h.feed(gpu(pid)) if isinstance(s, SpanRecord)]
    spans = [s for s in h.feed(host(pid, 0)) if isinstance(s, SpanRecord)]
    assert sorted(s.name for s in spans) == ["nccl AllReduce", "ncclAllReduce", "ncclAllReduce gpu"]


def test_p2p_gets_a_gpu_span_and_calls_without_the_plugin_get_none() -> None:
    h = ranks()
    pid = PIDS[2]
    send = NcclP2P(pid, pid, T0, T0 + 100, "Send", HANDLE, 256, 7, 0, 0, 0, 0, 0, False, 0x77)
    p = NcclProfP2P(pid, pid, T0 + 50, 0x99, CTX, 0x41, 0x77, "Send", 256, "ncclFloat32", 0, 2, T0, T0 + 1000, 2)
    spans = [s for s in h.feed(send, p) if isinstance(s, SpanRecord)]
    g = next(s for s in spans if s.name == "ncclSend gpu")
    assert g.trace_id is None and g.parent_span_id is None  # a trace of its own (the gateway moves the host span)
    assert g.attributes["nccl.peer"] == 0 and g.attributes["nccl.busbw"] == pytest.approx(1024 / 1e-6)
    assert "nccl.algo" not in g.attributes
    plain = [s for s in h.feed(host(pid, 1, api=0)) if isinstance(s, SpanRecord)]
    assert [s.name for s in plain] == ["ncclAllReduce"]


def test_unsynced_clocks_exits_and_full_tables_are_counted() -> None:
    h = ranks()
    pid = PIDS[1]
    far = gpu(pid, start=T0 + 2 * MAX_CLOCK_SKEW_NS)
    spans = [s for s in h.feed(host(pid, 0), far) if isinstance(s, SpanRecord)]
    g = next(s for s in spans if s.name.endswith(" gpu"))
    assert g.attributes["nccl.gpu.clock"] == "unsynced" and g.start_ns == T0 + 20_000  # the host call's end
    assert g.end_ns - g.start_ns == 4_000_000 and "nccl.gpu.queue_ns" not in g.attributes
    h.feed(gpu(pid, 1, handle=0x55, api=0x66), ProcessExit(pid, T0 + 10**9, "rank", 0, "nccl"))
    assert not h.proc.gpu.ready.items and not h.proc.gpu.comms.items.get((pid, CTX))
    book = GpuBook(2, h.ctx.telemetry)
    for i in range(3):
        book.host(pid, 100 + i, HostCall("ncclAllReduce", T0, {}, None, None, 2))
    assert h.ctx.telemetry.get(DROPPED, receiver="nccl", reason="gpu_table_full") == 1
    book = GpuBook(2, h.ctx.telemetry)
    for i in range(3):  # GPU results no host call claims (calls the uprobes did not see): pushed out, not lost
        book.done(gpu(pid, i, handle=i + 1, api=100 + i))
    assert h.ctx.telemetry.get("otel_ebpf.nccl.gpu.unmatched") == 1
    assert h.ctx.telemetry.get(DROPPED, receiver="nccl", reason="gpu_table_full") == 1


def test_a_process_whose_nccl_is_not_probed_gets_joinable_spans_from_the_plugin_alone() -> None:
    """NCCL linked statically (no libnccl to uprobe): the plugin's records are the collective's spans, with the
    plugin's identity (comm hash, rank, size, NCCL's per-function seq) and GPU time; rank 0 adds the root."""
    h = Harness(host="node-b")
    spans = {}
    for rank, pid in enumerate(PIDS):
        h.feed(comm(pid, rank))
        out = [s for s in h.feed(gpu(pid, seq=5, start=T0 + 30_000 + rank * 1000)) if isinstance(s, SpanRecord)]
        spans[rank] = out
    assert sorted(s.name for s in spans[0]) == ["nccl AllReduce", "ncclAllReduce"]
    assert [s.name for s in spans[1]] == ["ncclAllReduce"]
    cid = "00000000feedbeef/AllReduce"
    for rank in (1, 2):
        (s,) = spans[rank]
        a = s.attributes
        trace, root, own = collective_ids(cid, 5, rank)
        assert (s.trace_id, s.span_id, s.parent_span_id) == (trace, own, root)
        assert (a["nccl.comm.id"], a["nccl.seq"], a["nccl.rank"], a["nccl.nranks"]) == (cid, 5, rank, 3)
        assert (a["nccl.source"], a["nccl.timing"], a["nccl.op"], a["nccl.datatype"]) == \
            ("profiler_plugin", "gpu", "AllReduce", "float32")
        assert a["nccl.bytes"] == (1 << 20) * 4 and a["nccl.gpu.duration_ns"] == 4_000_000
        assert (s.start_ns, s.end_ns) == (T0 + 30_000 + rank * 1000, T0 + 30_000 + rank * 1000 + 4_000_000)
        assert a["nccl.busbw"] == pytest.approx((1 << 20) * 4 / 4e-3 * 2 * 2 / 3)
    root = next(s for s in spans[0] if s.name == "nccl AllReduce")
    assert root.span_id == collective_ids(cid, 5, 0)[1] and root.parent_span_id is None
    assert "nccl.rank" not in root.attributes and root.attributes["nccl.source"] == "profiler_plugin"


@pytest.mark.parametrize(("op", "n", "mult", "factor"), [
    ("AllReduce", 8, 1, 14 / 8), ("AllGather", 8, 8, 7 / 8), ("ReduceScatter", 4, 4, 3 / 4),
    ("AlltoAll", 2, 2, 1 / 2), ("Broadcast", 8, 1, 1.0), ("Send", 2, 1, 1.0)])
def test_bus_factors_are_those_of_nccl_tests(op: str, n: int, mult: int, factor: float) -> None:
    assert bus_factor(op, n) == (mult, pytest.approx(factor))


def test_a_split_childs_call_the_agent_could_not_rank_takes_nccls_rank_and_the_gateways_parent_id() -> None:
    """Its rank is left to the gateway (nccl.parent.rank): the plugin knows it from NCCL, and the GPU span's
    parent is the id the gateway gives the host span once ranked."""
    h = ranks()
    book = h.proc.gpu
    call = HostCall("ncclAllReduce", T0, {"nccl.op": "AllReduce", "nccl.comm.id": "00000000000000c1", "nccl.seq": 4,
                                          "nccl.parent.rank": 2, "nccl.bytes": 4096}, trace_id=77, span_id=None,
                    nranks=None)
    pid = PIDS[2]
    book.comm(NcclProfComm(pid, pid, T0, 0x12, 0xabc, 1, 2, 1, "", 1))
    op = NcclProfColl(pid, pid, T0, 0x5, 0x12, 0, API, 0, "AllReduce", 1024, "ncclFloat32", 0, "RING", "LL", 2, 4,
                      T0, T0 + 4_000_000, 2)
    _, _, attrs, parent = book.gpu_attributes(op, call)
    assert (attrs["nccl.rank"], attrs["nccl.nranks"]) == (1, 2)
    assert parent == collective_ids("00000000000000c1", 4, 1)[2]
    assert attrs["nccl.busbw"] == pytest.approx(4096 / 4e-3 * 2 * 1 / 2)  # AllReduce on the plugin's 2 ranks


def test_a_gpu_time_that_cannot_be_a_span_is_counted_not_emitted() -> None:
    """A stop before its start, or a kernel lasting more than a day, is a bad record: its end would not even be a
    time OTLP can carry (fixed64), and its exporter would fail the whole batch."""
    h = ranks()
    pid = PIDS[1]
    h.feed(host(pid, 0))
    for bad in (gpu(pid, dur=-5), gpu(pid, dur=MAX_GPU_DURATION_NS + 1), gpu(pid, start=0)):
        assert not [s for s in h.feed(bad) if isinstance(s, SpanRecord)]
    assert h.ctx.telemetry.get(DROPPED, receiver="nccl", reason="bad_gpu_time") == 3
    assert [s.name for s in h.feed(gpu(pid)) if isinstance(s, SpanRecord)] == ["ncclAllReduce gpu"]
