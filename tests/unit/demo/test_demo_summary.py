"""otel_ebpf.demo.summary on a small synthetic traces.jsonl, shaped as the gateway's file exporter
writes it (OTLP/JSON: hex ids, int64 as strings)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otel_ebpf.demo import summary


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        v: dict[str, Any] = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, (list, tuple)):
        v = {"arrayValue": {"values": [_attr("", x)["value"] for x in value]}}
    else:
        v = {"stringValue": value}
    return {"key": key, "value": v}


def _request(host: str, spans: list[dict[str, Any]]) -> str:
    resource = {"attributes": [_attr("host.name", host), _attr("service.name", "otel-ebpf-demo")]}
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]})


def _span(name: str, seq: int, attrs: dict[str, Any], parent: str = "") -> dict[str, Any]:
    attributes = [_attr("nccl.comm.id", "00000000000000aa"), _attr("nccl.seq", seq), _attr("nccl.op", "AllReduce")]
    attributes += [_attr(k, v) for k, v in attrs.items()]
    span: dict[str, Any] = {"traceId": f"{seq:032x}", "spanId": f"{seq + 1:016x}", "name": name,
                            "attributes": attributes, "events": []}
    if parent:
        span["parentSpanId"] = parent
    return span


def _root(seq: int, straggler: int | None, skew_ms: float) -> dict[str, Any]:
    attrs: dict[str, Any] = {"nccl.ranks.arrived": 4 if straggler is not None else 3,
                             "nccl.skew_ns": int(skew_ms * 1e6)}
    if straggler is not None:
        attrs.update({"nccl.straggler.rank": straggler,
                      "nccl.straggler.host": "node-1" if straggler >= 2 else "node-0"})
    return _span("nccl AllReduce", seq, attrs)


def _rank(rank: int) -> dict[str, Any]:
    return _span("ncclAllReduce", 0, {"nccl.rank": rank}, parent="0000000000000001")


def _jsonl(tmp_path: Path) -> Path:
    desync = {"name": "nccl.desync", "timeUnixNano": "1",
              "attributes": [_attr("nccl.missing_ranks", [1]), _attr("nccl.missing.hosts", ["node-0"]),
                             _attr("nccl.waited_ns", 2_000_000_000)]}
    partial = _root(3, None, 5.0)
    partial["attributes"] += [_attr("nccl.partial", True), _attr("nccl.missing_ranks", [1])]
    partial["events"] = [desync]
    node0 = [_root(0, 3, 30.0), _root(1, 3, 32.0), _root(2, 2, 10.0), partial, _rank(0), _rank(1)]
    node1 = [_rank(2), _rank(3)]
    path = tmp_path / "traces.jsonl"
    path.write_text("\n".join([_request("node-0", node0), "not json", _request("node-1", node1), ""]) + "\n")
    return path


def test_read_counts_complete_and_partial_collectives_and_their_hosts(tmp_path: Path) -> None:
    s = summary.read(_jsonl(tmp_path))
    assert (len(s.collectives), len(s.complete), len(s.partial)) == (4, 3, 1)
    assert s.rank_hosts == {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}
    assert s.spans == 8 and s.bad_lines == 1  # 4 roots + 4 rank spans; "not json" skipped


def test_the_most_frequent_straggler_and_skew_percentiles(tmp_path: Path) -> None:
    s = summary.read(_jsonl(tmp_path))
    assert s.straggler() == (3, "node-1", 2)
    assert s.skew_ms() == (30.0, 32.0)  # complete collectives only: 10, 30, 32 ms


def test_desync_events_name_the_missing_ranks(tmp_path: Path) -> None:
    (d,) = summary.read(_jsonl(tmp_path)).desyncs
    assert (d.op, d.seq, d.missing_ranks, d.missing_hosts, d.waited_ms) == ("AllReduce", 3, (1,), ("node-0",), 2000.0)
    assert summary.read(_jsonl(tmp_path)).partial[0].missing_ranks == (1,)


def test_render_says_whether_the_injected_faults_were_found(tmp_path: Path) -> None:
    text = summary.render(summary.read(_jsonl(tmp_path)), straggler=3, killed=1, out_dir=tmp_path)
    assert "4 (3 complete, 1 partial)" in text
    assert "straggler: rank 3 on node-1, last to arrive in 2/3 complete collectives (injected: rank 3: FOUND)" in text
    assert "p50 30.0 ms, max 32.0 ms" in text
    assert "desync: AllReduce seq 3 waited 2.0s for ranks 1 (hosts node-0)" in text
    assert "injected crash of rank 1: FOUND" in text
    other = summary.render(summary.read(_jsonl(tmp_path)), straggler=0, killed=2, out_dir=tmp_path)
    assert "(injected: rank 0: NOT found)" in other and "injected crash of rank 2: NOT found" in other


def test_a_missing_file_is_an_empty_summary(tmp_path: Path) -> None:
    s = summary.read(tmp_path / "nope.jsonl")
    assert s.collectives == [] and s.straggler() is None and s.skew_ms() is None
    assert "none found" in summary.render(s, straggler=None, killed=None, out_dir=tmp_path)


def _why(tmp_path: Path, figures: dict[str, tuple[float, float]]) -> str:
    roots = []
    for seq in (0, 1):
        root = _root(seq, 3, 30.0)
        for name, (mine, peers) in figures.items():
            root["attributes"] += [{"key": f"nccl.straggler.{name}", "value": {"doubleValue": mine}},
                                   {"key": f"nccl.peers_median.{name}", "value": {"doubleValue": peers}}]
        roots.append(root)
    path = tmp_path / "why.jsonl"
    path.write_text(_request("node-1", [*roots, _rank(3)]) + "\n")
    return summary.render(summary.read(path), straggler=3, killed=None, out_dir=tmp_path)


def test_why_late_names_the_figures_where_the_straggler_exceeds_its_peers(tmp_path: Path) -> None:
    text = _why(tmp_path, {"on_cpu.duration": (0.0295, 0.0028), "off_cpu.duration": (0.001, 0.025),
                           "runq.duration": (0.0004, 0.0003), "interval.duration": (0.035, 0.036)})
    line = next(ln for ln in text.splitlines() if "why late" in ln)
    assert "rank 3 spent on-CPU 29.5 ms (peers' median 2.8 ms)" in line
    assert "off-CPU" not in line and "run queue" not in line  # less than, or within 1 ms of, the peers


def test_why_late_says_so_when_the_host_figures_match_the_peers(tmp_path: Path) -> None:
    text = _why(tmp_path, {"on_cpu.duration": (0.003, 0.003), "off_cpu.sleep.duration": (0.02, 0.0205)})
    assert "match its peers': the delay is not on the host" in text


def test_hang_lines_come_from_the_gateways_desync_and_straggler_log_records(tmp_path: Path) -> None:
    """Written by the real file exporter (emit/jsonfile.py) from the join's own LogRecords."""
    from opentelemetry.sdk.resources import Resource

    from otel_ebpf.core.events import LogRecord
    from otel_ebpf.demo.hangs import read_hangs
    from otel_ebpf.emit.jsonfile import JsonLinesLogExporter
    from otel_ebpf.emit.logs import LogBuilder

    records = [
        LogRecord(None, 1, "otel_ebpf.nccl.desync", "NCCL desync ...", {
            "nccl.comm.id": "00000000000000aa", "nccl.seq": 3, "nccl.op": "AllReduce", "nccl.missing_ranks": (2,),
            "nccl.missing.stack_ranks": (2,), "nccl.missing.functions": ("stuck_in_dataloader_fetch (train.py:14)",),
            "nccl.missing.silence_ms": (18_400.0,)}, severity="WARN"),
        LogRecord(None, 2, "otel_ebpf.nccl.desync", "no stack yet", {"nccl.comm.id": "aa", "nccl.seq": 3}),
        LogRecord(None, 3, "otel_ebpf.nccl.straggler", "...", {
            "nccl.straggler.state": "raised", "nccl.rank": 1, "host.name": "node-0", "nccl.comm.id": "bb",
            "nccl.straggler.share": 0.92}, severity="WARN"),
        LogRecord(None, 4, "otel_ebpf.nccl.straggler", "...", {
            "nccl.straggler.state": "raised", "nccl.straggler.kind": "gpu", "nccl.rank": 3, "host.name": "node-1",
            "nccl.comm.id": "bb", "nccl.straggler.gpu.share": 0.96}, severity="WARN"),
    ]
    builder, resource = LogBuilder(), Resource.create({"service.name": "gateway"})
    JsonLinesLogExporter(tmp_path).export([builder.build(r, resource) for r in records])
    lines = read_hangs(tmp_path / "logs.jsonl")
    assert lines == ["hang: AllReduce seq 3 of comm 00000000000000aa: rank 2 is in stuck_in_dataloader_fetch "
                     "(train.py:14), silent 18s",
                     "persistent straggler raised: rank 1 on node-0 (comm bb, share 92%)",
                     "persistent GPU straggler raised: rank 3 on node-1 (comm bb, kernel last in 96%)"]
    assert read_hangs(tmp_path / "missing.jsonl") == []
    text = summary.render(summary.Summary(), straggler=None, killed=None, out_dir=tmp_path, hangs=lines)
    assert lines[0] in text
