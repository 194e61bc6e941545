"""otel_ebpf.report.perfetto: OTLP JSON lines -> Chrome Trace Event Format (ui.perfetto.dev, chrome://tracing).

Checked against the format's rules: a JSON object with ``traceEvents``; complete events
(``ph: "X"``) carry name/ph/ts/dur/pid/tid with ts and dur in microseconds; metadata events
name every pid and tid used; counters carry numeric args; events on one thread track nest
(complete events that partly overlap cannot be drawn on one track).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.report.perfetto import to_chrome_trace, write_chrome_trace
from otel_ebpf.report import read_otlp_json
from otel_ebpf.report.otlpfiles import OtlpData, SpanRow
from tests.unit.report import otlp_job

DEMO = Path(__file__).parent / "data" / "demo_kill"


def _valid(trace: dict[str, Any]) -> list[dict[str, Any]]:
    events = trace["traceEvents"]
    assert isinstance(events, list) and trace["displayTimeUnit"] in ("ms", "ns")
    named = {(e["pid"], e["tid"] if e["name"] == "thread_name" else None)
             for e in events if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    data = [e for e in events if e["ph"] != "M"]
    assert [e["ts"] for e in data] == sorted(e["ts"] for e in data)
    for e in data:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(e), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["ts"], float | int)
        assert (e["pid"], None) in named, f"pid {e['pid']} has no process_name"
        if e["ph"] == "X":
            assert e["dur"] >= 0 and (e["pid"], e["tid"]) in named, e
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, float | int) for v in e["args"].values()), e
        else:
            assert e["ph"] == "i" and e["s"] in ("t", "p", "g"), e
    json.dumps(trace, allow_nan=False)  # strict JSON
    return data


def _nested(events: list[dict[str, Any]]) -> None:
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append(e)
    for track in tracks.values():
        stack: list[float] = []
        for e in sorted(track, key=lambda e: (e["ts"], -e["dur"])):
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, f"{e['name']} partly overlaps its track's open span"
            stack.append(end)


def test_job_round_trips_every_span_event_and_point_in_microseconds(tmp_path: Path) -> None:
    job = otlp_job.write_job(tmp_path, collectives=5)
    data = read_otlp_json(tmp_path)
    trace = to_chrome_trace(data)
    events = _valid(trace)
    _nested(events)
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == job.spans
    assert sum(e["ph"] == "i" for e in events) == 1  # the nccl.desync span event
    points = sum(1 for p in data.metrics if p.value is not None or p.sum is not None)
    assert sum(e["ph"] == "C" for e in events) == points
    slow = max(spans, key=lambda e: e["dur"])
    assert (slow["name"], slow["dur"]) == ("cudaMemcpyAsync", otlp_job.SLOW[2] / 1e3)  # 50 ms = 50000 us
    assert trace["otherData"]["t0_unix_ns"] == min(s.start_ns for s in data.spans)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert "node-1 rank 3: python3 (pid 1003)" in names and "collectives (joined)" in names
    sort = {e["pid"]: e["args"]["sort_index"] for e in trace["traceEvents"] if e["name"] == "process_sort_index"}
    by_name = {e["args"]["name"]: e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert sort[by_name["node-0 rank 0: python3 (pid 1000)"]] < sort[by_name["node-1 rank 3: python3 (pid 1003)"]]
    root = next(e for e in spans if e["name"] == "nccl AllReduce" and e["args"].get("nccl.partial"))
    assert root["pid"] == by_name["collectives (joined)"] and root["args"]["nccl.missing_ranks"] == [1]


def _row(name: str, start: int, end: int) -> SpanRow:
    return SpanRow(trace_id="1" * 32, span_id=f"{start:016x}", parent_span_id="", name=name, kind="internal",
                   start_ns=start, end_ns=end, status="unset", status_message="", scope="s",
                   resource={"host.name": "h", "process.pid": 7}, attributes={"thread.id": 7})


def test_overlapping_spans_of_one_thread_move_to_extra_lanes() -> None:
    # a contains b (nests); c starts inside b and ends after it: it cannot share their track
    rows = [_row("a", 0, 10_000), _row("b", 1_000, 5_000), _row("c", 4_000, 8_000), _row("d", 9_000, 9_500)]
    trace = to_chrome_trace(OtlpData(spans=rows))
    events = _valid(trace)
    _nested(events)
    tid = {e["name"]: e["tid"] for e in events}
    assert tid["a"] == tid["b"] == tid["d"] != tid["c"]
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {"thread 7", "thread 7 (overlap 1)"}


@pytest.mark.parametrize("source", [DEMO, DEMO / "traces.jsonl"])
def test_recorded_demo_output_converts_to_a_valid_trace(source: Path, tmp_path: Path) -> None:
    out = write_chrome_trace(source, tmp_path / "trace.json")
    trace = json.loads(out.read_text())
    events = _valid(trace)
    _nested(events)
    assert sum(e["ph"] == "X" for e in events) == len(read_otlp_json(source).spans) > 0
