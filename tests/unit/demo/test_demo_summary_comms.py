"""otel_ebpf.demo.summary per communicator: a 2x2 job's traces.jsonl as the gateway writes it (rank spans with
the process's ``ml.rank`` resource and the communicator's ``nccl.rank``, collective roots, a grouped send/recv
root, split spans) and the job's own record of its groups (train.py's comms-rank<r>.json)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otel_ebpf.demo import summary

from .test_demo_summary import _attr

WORLD, DP0, DP1, TP0, TP1, TP4 = "00000000000000a0", "00000000000000d0", "00000000000000d1", "00000000000000e0", \
    "00000000000000e1", "00000000000000f4"
# comm id -> global ranks in communicator rank order (torch's split order: key = parent rank)
MEMBERS = {WORLD: (0, 1, 2, 3), DP0: (0, 2), DP1: (1, 3), TP0: (0, 1), TP1: (2, 3), TP4: (0, 1, 2, 3)}
NAMES = [("world", [0, 1, 2, 3]), ("dp", [0, 2]), ("tp", [0, 1]), ("dp", [1, 3]), ("tp", [2, 3])]
_ids = iter(range(1, 1 << 20))


def _span(name: str, attrs: dict[str, Any], parent: str = "", events: list[Any] | None = None) -> dict[str, Any]:
    span: dict[str, Any] = {"traceId": f"{next(_ids):032x}", "spanId": f"{next(_ids):016x}", "name": name,
                            "attributes": [_attr(k, v) for k, v in attrs.items()], "events": events or []}
    if parent:
        span["parentSpanId"] = parent
    return span


def _request(resource: dict[str, Any], spans: list[dict[str, Any]]) -> str:
    res = {"attributes": [_attr(k, v) for k, v in resource.items()]}
    return json.dumps({"resourceSpans": [{"resource": res, "scopeSpans": [{"spans": spans}]}]})


def _rank_spans(comm: str, op: str, seq: int) -> list[str]:
    """Each member's span of one collective, from its own process (ml.rank) on its node."""
    return [_request({"host.name": f"node-{g // 2}", "ml.rank": g},
                     [_span(f"nccl{op}", {"nccl.comm.id": comm, "nccl.rank": r, "nccl.nranks": len(MEMBERS[comm]),
                                          "nccl.seq": seq, "nccl.op": op}, parent="00000000000000ff")])
            for r, g in enumerate(MEMBERS[comm])]


def _root(comm: str, op: str, seq: int, straggler: int | None = None, missing: tuple[int, ...] = ()) -> str:
    """A joined collective's root; ``straggler``/``missing`` are ranks OF THE COMMUNICATOR, as the gateway
    writes them."""
    attrs: dict[str, Any] = {"nccl.comm.id": comm, "nccl.seq": seq, "nccl.op": op, "nccl.nranks": len(MEMBERS[comm]),
                             "nccl.ranks.arrived": len(MEMBERS[comm]) - len(missing), "nccl.skew_ns": 1_000_000}
    events = []
    if straggler is not None:
        attrs.update({"nccl.straggler.rank": straggler, "nccl.straggler.host": "node-1"})
    if missing:
        attrs.update({"nccl.partial": True, "nccl.missing_ranks": list(missing)})
        events = [{"name": "nccl.desync", "timeUnixNano": "1",
                   "attributes": [_attr("nccl.missing_ranks", list(missing)), _attr("nccl.waited_ns", 2_000_000_000),
                                  _attr("nccl.missing.hosts", ["node-1"])]}]
    return _request({"host.name": "node-0", "ml.rank": 0}, [_span(f"nccl {op}", attrs, events=events)])


def _split(child: str, parent: str) -> list[str]:
    return [_request({"host.name": f"node-{g // 2}", "ml.rank": g},
                     [_span("ncclCommSplit", {"nccl.comm.id": child, "nccl.parent.comm.id": parent,
                                              "nccl.parent.rank": g, "nccl.parent.nranks": 4})])
            for g in MEMBERS[child]]


def _job(tmp_path: Path) -> Path:
    lines: list[str] = []
    for comm in (DP0, DP1, TP0, TP1, TP4):
        lines += _split(comm, WORLD)
    for seq in range(3):  # global rank 3 is last everywhere it takes part; in {0, 2}: global rank 2
        lines += [_root(WORLD, "AllReduce", seq, straggler=3), _root(DP1, "AllGather", seq, straggler=1),
                  _root(TP1, "AllReduce", seq, straggler=1), _root(DP0, "AllGather", seq, straggler=1)]
        lines += _rank_spans(WORLD, "AllReduce", seq) + _rank_spans(DP1, "AllGather", seq)
        lines += _rank_spans(TP1, "AllReduce", seq) + _rank_spans(DP0, "AllGather", seq)
    lines += [_root(DP0, "ReduceScatter", 3), *_rank_spans(DP0, "ReduceScatter", 3)]
    lines.append(_root(DP1, "ReduceScatter", 3, missing=(1,)))  # global rank 3 died: dp rank 1 of {1, 3}
    lines += _rank_spans(DP1, "ReduceScatter", 3)[:1]
    lines += [_root(TP4, "AllReduce", 0, straggler=3), *_rank_spans(TP4, "AllReduce", 0)]
    p2p = {"nccl.op": "GroupP2P", "nccl.comm.id": TP0, "nccl.group.ranks": [0, 1], "nccl.group.nranks": 2,
           "nccl.skew_ns": 500_000, "nccl.p2p.sends": 1}
    lines.append(_request({"host.name": "gateway"}, [_span("nccl GroupP2P", p2p)]))
    lines.append(_request({"host.name": "gateway"}, [_span("nccl GroupP2P", {**p2p, "nccl.partial": True})]))
    lines += _rank_spans(TP0, "Send", 0)  # the instances' members: the only spans that rank TP0
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _names() -> list[summary.CommName]:
    return [summary.CommName(n, tuple(m)) for n, m in NAMES]


def test_straggler_and_missing_ranks_are_global_ranks(tmp_path: Path) -> None:
    s = summary.read(_job(tmp_path))
    rank, host, n = s.straggler() or (None, None, 0)
    # 3 in world + 6 in {1,3} and {2,3} + 1 in TP4, as communicator rank 3, 1, 1 and 3: all global rank 3. Read
    # as communicator ranks, rank 1 (9 times, its last in {0,2} included) would have been named.
    assert (rank, host, n) == (3, "node-1", 10)
    (partial,) = s.partial
    assert partial.comm == DP1 and partial.missing_ranks == (3,) and s.desyncs[0].missing_ranks == (3,)
    assert s.rank_hosts == {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}
    text = summary.render(s, straggler=3, killed=3, out_dir=tmp_path, comms=_names())
    assert "(injected: rank 3: FOUND)" in text and "injected crash of rank 3: FOUND" in text


def test_each_communicator_is_listed_with_its_ranks_counts_ops_and_the_jobs_name(tmp_path: Path) -> None:
    rows = summary.read(_job(tmp_path)).communicators(_names())
    got = [(r.name, r.ranks, r.size, r.complete, r.partial, dict(r.ops)) for r in rows]
    assert got == [
        ("world", (0, 1, 2, 3), 4, 3, 0, {"AllReduce": 3}),
        ("dp", (0, 2), 2, 4, 0, {"AllGather": 3, "ReduceScatter": 1}),
        ("dp", (1, 3), 2, 3, 1, {"AllGather": 3, "ReduceScatter": 1}),
        ("tp", (0, 1), 2, 1, 1, {"GroupP2P": 2}),  # grouped send/recv instances count as its collectives
        ("tp", (2, 3), 2, 3, 0, {"AllReduce": 3}),
        ("split of world", (0, 1, 2, 3), 4, 1, 0, {"AllReduce": 1}),  # world's ranks, but a split: not "world"
    ]
    assert [r.comm for r in rows] == [WORLD, DP0, DP1, TP0, TP1, TP4]


def test_groups_sharing_a_rank_set_are_told_apart_by_whether_they_are_a_split(tmp_path: Path) -> None:
    names = [*_names(), summary.CommName("tp4", (0, 1, 2, 3))]
    by_comm = {r.comm: r.name for r in summary.read(_job(tmp_path)).communicators(names)}
    assert by_comm[WORLD] == "world" and by_comm[TP4] == "tp4"
    both = [*names, summary.CommName("ep", (0, 1, 2, 3))]
    assert {r.comm: r.name for r in summary.read(_job(tmp_path)).communicators(both)}[TP4] == "tp4/ep"


def test_render_lists_the_communicators_and_the_grouped_send_recv(tmp_path: Path) -> None:
    text = summary.render(summary.read(_job(tmp_path)), straggler=3, killed=None, out_dir=tmp_path, comms=_names())
    assert "collectives joined: 15 (14 complete, 1 partial) + 2 grouped send/recv (1 complete, 1 partial)" in text
    assert "communicators: 6 (ranks are global ranks; collectives joined per communicator)" in text
    assert f"dp             ranks 1,3 (size 2, comm {DP1[:8]}): 4 (3 complete, 1 partial): AllGather 3, " \
           "ReduceScatter 1" in text
    unnamed = summary.render(summary.read(_job(tmp_path)), straggler=3, killed=None, out_dir=tmp_path)
    assert f"- ranks 0,2 (size 2, comm {DP0[:8]})" in unnamed  # no names given: the job's groups are unknown


def test_read_comms_keeps_each_group_once_in_rank_file_order_and_skips_bad_files(tmp_path: Path) -> None:
    for rank in (0, 1, 2, 3):
        mine = [{"name": n, "members": m, "rank": m.index(rank), "size": len(m)} for n, m in NAMES if rank in m]
        (tmp_path / f"comms-rank{rank}.json").write_text(json.dumps(mine))
    (tmp_path / "comms-rank10.json").write_text("not json")
    (tmp_path / "comms-rank11.json").write_text(json.dumps([{"name": "x"}, {"name": "ep", "members": [0, 1]}]))
    assert summary.read_comms(tmp_path) == [
        summary.CommName("world", (0, 1, 2, 3)), summary.CommName("dp", (0, 2)), summary.CommName("tp", (0, 1)),
        summary.CommName("dp", (1, 3)), summary.CommName("tp", (2, 3)), summary.CommName("ep", (0, 1))]
    assert summary.read_comms(tmp_path / "missing") == []


def test_why_late_looks_at_the_collectives_the_straggler_kept_the_others_waiting_longest(tmp_path: Path) -> None:
    """A step of many collectives: the straggler's 30 ms asleep precedes only the first (large skew); it is
    last, by little, to the others too, with the same figures as its peers. A median over all of them would
    say the host looked normal."""
    lines = []
    for seq in range(8):
        first = seq % 4 == 0
        root = json.loads(_root(WORLD, "AllReduce", seq, straggler=3))
        span = root["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
        span["attributes"] = [a for a in span["attributes"] if a["key"] != "nccl.skew_ns"]
        span["attributes"].append(_attr("nccl.skew_ns", 31_000_000 if first else 400_000))
        for key, value in (("nccl.straggler.off_cpu.sleep.duration", 0.030 if first else 0.001),
                           ("nccl.peers_median.off_cpu.sleep.duration", 0.001)):
            span["attributes"].append({"key": key, "value": {"doubleValue": value}})
        lines += [json.dumps(root), *_rank_spans(WORLD, "AllReduce", seq)]
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join(lines) + "\n")
    s = summary.read(path)
    assert len(s.late_figures(3)) == 2
    text = summary.render(s, straggler=3, killed=None, out_dir=tmp_path)
    assert "why late: in the step before, rank 3 spent off-CPU (sleep) 30.0 ms (peers' median 1.0 ms)" in text
