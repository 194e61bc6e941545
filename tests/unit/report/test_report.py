"""otel_ebpf.report: OTLP JSON lines -> one self-contained report.html.

Inputs: the synthetic job of tests/unit/otlp_job.py (known answers, written by the real file
exporters), and tests/unit/report/data/demo_kill/, recorded from a real run of
``otel-ebpf demo --steps 8 --kill-rank 1 --kill-after-step 4`` (gateway output; trimmed to
<200 KB by removing the resource attributes process.command_line, process.command_args and
service.instance.id). The page's script is run under node with a DOM stand-in
(data/dom_stand_in.js) when node is installed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.cli import main
from otel_ebpf.demo import summary
from otel_ebpf.report import model, read_otlp_json, render_html, write_report
from tests.unit.report import otlp_job

DATA = Path(__file__).parent / "data"
DEMO = DATA / "demo_kill"


def _embedded(page: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="oe-data">(.*?)</script>', page, re.S)
    assert m, "no embedded data block"
    return json.loads(m.group(1))


@pytest.fixture
def job(tmp_path: Path) -> otlp_job.Job:
    return otlp_job.write_job(tmp_path, collectives=6)


def test_reader_reads_every_span_and_point_and_counts_bad_lines(job: otlp_job.Job) -> None:
    with open(job.directory / "traces.jsonl", "a") as fh:
        fh.write("{not json\n[1, 2]\n\n")
    data = read_otlp_json(job.directory)
    assert len(data.spans) == job.spans
    assert data.bad_lines == 2
    # 4 ranks x 2 collections x (counter + histogram) + the agent's drop counter
    assert len(data.metrics) == otlp_job.RANKS * 2 * 2 + 1
    slow = max(data.spans, key=lambda s: s.duration_ns)
    assert (slow.name, slow.duration_ns, slow.resource["ml.rank"]) == ("cudaMemcpyAsync", otlp_job.SLOW[2], 2)
    with pytest.raises(FileNotFoundError, match="no OTLP JSON lines"):
        read_otlp_json(job.directory / "missing")


def test_model_marks_the_straggler_lane_and_its_span_in_every_complete_collective(job: otlp_job.Job) -> None:
    built = model.build(read_otlp_json(job.directory))
    lanes = built["lanes"]
    assert [lane["label"] for lane in lanes] == [f"{otlp_job.host(r)} / rank {r} / python3 {1000 + r}"
                                                 for r in range(otlp_job.RANKS)]
    assert [[row["label"] for row in lane["rows"]] for lane in lanes] == [
        [f"thread {2000 + r} \u00b7 CUDA", f"thread {2000 + r} \u00b7 NCCL"] for r in range(otlp_job.RANKS)]
    assert [lane["straggler"] for lane in lanes] == [r == otlp_job.STRAGGLER for r in range(otlp_job.RANKS)]
    flagged = [s for s in built["spans"] if s[5] & 1]
    assert len(flagged) == job.collectives - 1  # every complete collective; the partial one has none
    assert {(s[0], s[4]) for s in flagged} == {(otlp_job.STRAGGLER, "ncclAllReduce")}
    assert len(built["spans"]) == job.rank_spans + job.cuda_spans
    colls = built["collectives"]
    assert len(colls) == job.collectives
    assert [c["partial"] for c in colls] == [False] * (job.collectives - 1) + [True]
    assert colls[-1]["missing"] == [otlp_job.MISSING_RANK] and len(colls[-1]["desyncs"]) == 1
    meta = built["meta"]
    assert meta["straggler"] == {"rank": otlp_job.STRAGGLER, "host": otlp_job.STRAGGLER_HOST,
                                 "count": job.collectives - 1, "of": job.collectives - 1, "why": []}
    assert (meta["collectives"], meta["complete"], meta["partial"], meta["desyncs"]) == (job.collectives,
                                                                                      job.collectives - 1, 1, 1)
    assert meta["dropped"] == otlp_job.DROPPED and meta["dropped_by"][0]["reason"] == "ringbuf_full"
    assert meta["ranks"] == list(range(otlp_job.RANKS)) and meta["errors"] == otlp_job.RANKS
    assert (meta["processes"], meta["threads"]) == (otlp_job.RANKS, otlp_job.RANKS)


def test_tables_list_the_slowest_calls_and_collectives_by_skew(job: otlp_job.Job) -> None:
    built = model.build(read_otlp_json(job.directory), top=5)
    slow = built["top_slow"]
    assert len(slow) == 5
    assert (slow[0]["name"], slow[0]["dur_ms"], slow[0]["rank"], slow[0]["host"], slow[0]["process"]) == (
        "cudaMemcpyAsync", 50.0, 2, "node-1", "python3 (1002)")
    assert [r["dur_ms"] for r in slow] == sorted((r["dur_ms"] for r in slow), reverse=True)
    skew = built["by_skew"]
    assert skew[0]["partial"] and skew[0]["missing"] == [otlp_job.MISSING_RANK]  # partial first
    assert [r["seq"] for r in skew] == [5, 4, 3, 2, 1]  # then by skew, largest first; top=5 rows
    charts = {c["name"]: c for c in built["charts"]}
    assert set(charts) == {"gpu.cuda.kernel.launch.calls", "gpu.cuda.memory.copies"}  # no self-telemetry
    launches = charts["gpu.cuda.kernel.launch.calls"]
    assert launches["unit"] == "{call}" and len(launches["series"]) == otlp_job.RANKS
    assert [p[1] for p in launches["series"][0]["points"]] == [10, 30]  # cumulative: 10, then 10 + 20
    assert [p[1] for p in charts["gpu.cuda.memory.copies"]["series"][0]["points"]] == [4096, 4096 * 3]
    assert (launches["what"], launches["section"], launches["readings"]) == ("cumulative total", 0, 2)
    assert launches["values"] and charts["gpu.cuda.memory.copies"]["values"]  # read twice: listed, not drawn


def test_span_cap_keeps_collective_spans_first_and_says_so(job: otlp_job.Job) -> None:
    built = model.build(read_otlp_json(job.directory), max_spans=10)
    assert len(built["spans"]) == 10
    assert all(s[4] == "ncclAllReduce" for s in built["spans"])
    assert built["span_note"].startswith(f"10 of {job.rank_spans + job.cuda_spans} spans shown")


def test_page_is_self_contained_and_embeds_the_data_safely(job: otlp_job.Job) -> None:
    data = read_otlp_json(job.directory)
    evil = "</script><script>alert(1)</script><!--"
    data.spans[0].attributes["evil"] = evil
    page = render_html(data, title="job <1>")
    for tag in re.findall(r"<(?:script|link|img|iframe|source|video|audio|embed|object)\b[^>]*>", page, re.I):
        assert not re.search(r"\b(?:src|href|data)\s*=", tag, re.I), tag
    assert not re.search(r"<[^>]+(?:src|href)\s*=\s*[\"']?(?:https?:)?//", page, re.I)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert page.count("<script") == 2 and "<title>job &lt;1&gt;</title>" in page
    embedded = _embedded(page)
    assert embedded == json.loads(json.dumps(model.build(data, title="job <1>")))
    assert evil in json.dumps(embedded["spans"])  # the value survives, inside the JSON block only


def test_recorded_demo_crash_shows_the_partial_collective_and_the_straggler(tmp_path: Path) -> None:
    out = write_report(DEMO, tmp_path / "r.html")
    built = _embedded(out.read_text())
    truth = summary.read(DEMO / "traces.jsonl")  # the demo's own, independent reading
    assert (built["meta"]["collectives"], built["meta"]["partial"]) == (len(truth.collectives), len(truth.partial))
    assert len(truth.partial) == 1 and built["meta"]["desyncs"] == len(truth.desyncs) == 1
    rank, host, n = truth.straggler() or (None, None, 0)
    assert built["meta"]["straggler"] == {"rank": rank, "host": host, "count": n, "of": len(truth.complete),
                                          "why": []}  # the recorded demo ran without the sched receiver
    assert [lane["rank"] for lane in built["lanes"] if lane["straggler"]] == [rank]
    assert sum(1 for s in built["spans"] if s[5] & 1) == len(truth.complete)
    partial = [c for c in built["collectives"] if c["partial"]]
    assert partial[0]["missing"] == list(truth.partial[0].missing_ranks)
    assert {c["name"] for c in built["charts"]} >= {"gpu.cuda.kernel.launch.calls", "nccl.collective.skew"}
    assert built["meta"]["hosts"] == sorted(set(truth.rank_hosts.values()))


def test_page_script_draws_lanes_bars_charts_and_tables(tmp_path: Path) -> None:
    if shutil.which("node") is None:  # scripts/setup.sh installs nodejs; CI must run this
        if os.environ.get("CI"):
            pytest.fail("node is not installed: the report page's script cannot be run")
        pytest.skip("node is not installed: the page's script is not run")
    out = write_report(DEMO, tmp_path / "r.html")
    run = subprocess.run(["node", str(DATA / "dom_stand_in.js"), str(out)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    drawn = json.loads(run.stdout)
    built = _embedded(out.read_text())
    # the page opens on the collectives (5 % margin): bars outside that window are not drawn
    starts = [c["start"] for c in built["collectives"]]
    ends = [c["start"] + c["dur"] for c in built["collectives"]]
    pad = max((max(ends) - min(starts)) * 0.05, 1000)
    lo, hi = max(0, min(starts) - pad), min(built["meta"]["span_us"] * 1.01, max(ends) + pad)
    visible = [s for s in built["spans"] if s[2] + s[3] >= lo and s[2] <= hi]
    assert 0 < len(visible) <= len(built["spans"])
    assert drawn["bars"] == len(visible) + len(built["collectives"])
    assert drawn["straggler_bars"] == sum(1 for s in visible if s[5] & 1) > 0
    assert drawn["coll_bars"] == len(built["collectives"]) and drawn["desyncs"] == 1
    assert drawn["straggler_lane_labels"] == 1 and drawn["lane_labels"] == len(built["lanes"]) + 1
    assert drawn["charts"] == len(built["charts"]) and drawn["slow_rows"] == len(built["top_slow"])
    assert drawn["skew_rows"] == len(built["by_skew"])
    assert "STRAGGLER" in drawn["tip"] and "nccl.rank = 3" in drawn["tip"]


def test_cli_report_writes_html_and_perfetto_and_names_a_missing_input(job: otlp_job.Job, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    html, trace = tmp_path / "out.html", tmp_path / "trace.json"
    assert main(["report", str(job.directory), "-o", str(html), "--perfetto", str(trace)]) == 0
    assert _embedded(html.read_text())["meta"]["spans"] == job.spans
    assert json.loads(trace.read_text())["traceEvents"]
    assert main(["report", str(job.directory)]) == 0 and (job.directory / "report.html").exists()
    assert main(["report", str(tmp_path / "nope")]) == 1
    assert "no OTLP JSON lines at" in capsys.readouterr().err
    assert main(["report", str(job.directory), "--max-spans", "0"]) == 2


def test_demo_closing_summary_writes_the_report_and_names_it(tmp_path: Path) -> None:
    out = tmp_path / "demo-out"
    shutil.copytree(DEMO, out)
    line = summary.html_report(out)
    assert line == str(out / "report.html") and _embedded((out / "report.html").read_text())["meta"]["partial"] == 1
    text = summary.render(summary.read(out / "traces.jsonl"), straggler=3, killed=1, out_dir=out, report=line)
    assert f"report: {out / 'report.html'} (open it in a browser; it needs no network)" in text
    (tmp_path / "file").write_text("")
    assert summary.html_report(tmp_path / "file" / "sub").startswith("none: the HTML report could not be written:")


def test_why_late_keeps_the_figures_where_the_straggler_spent_more_than_its_peers() -> None:
    from otel_ebpf.report.model import _why_late

    roots = [{"attrs": {"nccl.straggler.on_cpu.duration": 0.030 + i * 0.001, "nccl.peers_median.on_cpu.duration": 0.003,
                        "nccl.straggler.off_cpu.duration": 0.001, "nccl.peers_median.off_cpu.duration": 0.025,
                        "nccl.straggler.interval.duration": 0.04, "nccl.peers_median.interval.duration": 0.035}}
             for i in range(3)]
    assert _why_late(roots) == [["on_cpu", 31.0, 3.0]]  # medians; off-CPU (less) and the interval left out


def test_hang_forensics_records_are_listed_newest_last_with_their_stacks() -> None:
    """The gateway's desync reports and persistent stragglers and the agents' silent-rank stacks (log records)."""
    from otel_ebpf.report.otlpfiles import LogRow, OtlpData

    def row(t: int, event: str, body: str, **res: Any) -> LogRow:
        return LogRow(t, t, "WARN", 13, event, body, "", "", "s", {"host.name": "node-b", **res}, {"nccl.rank": 2})

    stack = "Thread 7 (idle): \"MainThread\"\n    stuck_in_dataloader_fetch (train.py:14)"
    logs = [row(3_000, "otel_ebpf.nccl.desync", "NCCL desync: comm c, seq 3 (AllReduce) has waited 2.0 s\nrank 2 ..."),
            row(2_000, "otel_ebpf.nccl.rank.stack", stack, **{"process.pid": 4242}),
            row(1_000, "app.log", "not forensics")]
    built = model.build(OtlpData(spans=[], metrics=[], logs=logs))
    f = built["forensics"]
    assert [r["event"] for r in f] == ["otel_ebpf.nccl.rank.stack", "otel_ebpf.nccl.desync"]
    assert f[0]["who"] == "node-b pid 4242" and f[0]["body"] == stack and f[0]["title"].startswith("Thread 7")
    assert f[1]["title"] == "NCCL desync: comm c, seq 3 (AllReduce) has waited 2.0 s"
    assert f[1]["t"] == 2.0 and built["meta"]["t0_ns"] == 1_000  # us; no spans, no metrics: t=0 is the first record


def test_rows_follow_threads_then_sources_and_nccl_gpu_time_has_its_own_row() -> None:
    """Main thread first, then other threads by id, then spans without a thread (the NCCL plugin's GPU time);
    inside a thread Python, torch ops, CUDA, NCCL, then other scopes."""
    from otel_ebpf.report.otlpfiles import SpanRow
    from otel_ebpf.report.timeline import lanes_and_spans

    def span(scope: str, name: str, tid: int | None, **attrs: Any) -> SpanRow:
        a = {"nccl.rank": 0, **attrs} | ({"thread.id": tid} if tid is not None else {})
        return SpanRow("t", name, "", name, "internal", 10, 20, "unset", "", scope,
                       {"host.name": "n0", "process.pid": 5, "process.executable.name": "python3"}, a)

    rows = [span("otel_ebpf.nccl", "ncclAllReduce gpu", None, **{"nccl.timing": "gpu"}),
            span("otel_ebpf.probes", "my_probe", 9), span("otel_ebpf.nccl", "ncclAllReduce", 9),
            span("otel_ebpf.cuda", "cudaMalloc", 5), span("otel_ebpf.torch", "addmm", 5),
            span("otel_ebpf.python", "job.step", 5)]
    (lane,), spans = lanes_and_spans(rows, {}, 0, 0)
    assert lane["label"] == "n0 / rank 0 / python3 5" and lane["straggler"]
    assert [r["label"] for r in lane["rows"]] == [
        "main thread \u00b7 Python", "main thread \u00b7 torch ops", "main thread \u00b7 CUDA",
        "thread 9 \u00b7 NCCL", "thread 9 \u00b7 probes", "NCCL on GPU"]
    assert sorted((lane["rows"][s[1]]["source"], s[4]) for s in spans) == sorted(
        [("NCCL on GPU", "ncclAllReduce gpu"), ("probes", "my_probe"), ("NCCL", "ncclAllReduce"),
         ("CUDA", "cudaMalloc"), ("torch ops", "addmm"), ("Python", "job.step")])
