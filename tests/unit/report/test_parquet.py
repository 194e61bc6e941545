"""otel_ebpf.report.parquet: spans.parquet / metrics.parquet from OTLP JSON lines, and typed events, read back
with pyarrow (and polars when installed), against the schema documented in docs/analysis.md."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_ebpf.cli import main
from otel_ebpf.core.events import SpanEventRecord, SpanRecord
from otel_ebpf.report.parquet import METRIC_COLUMNS, SPAN_COLUMNS, write_events, write_otlp_parquet
from otel_ebpf.receivers.cuda.events import KernelLaunch, MemcpyCall
from tests.unit.report import otlp_job

import pyarrow.parquet as pq  # a test dependency (pyproject: test extra)
DOCS = Path(__file__).resolve().parents[3] / "docs" / "analysis.md"


def test_spans_table_has_the_documented_columns_and_promoted_attributes(tmp_path: Path) -> None:
    job = otlp_job.write_job(tmp_path / "in", collectives=4)
    paths = write_otlp_parquet(tmp_path / "in", tmp_path / "out")
    spans = pq.read_table(paths["spans"])
    assert tuple(spans.column_names) == SPAN_COLUMNS
    assert spans.num_rows == job.spans
    rows = spans.to_pylist()
    slow = max(rows, key=lambda r: r["duration_ns"])
    assert (slow["name"], slow["duration_ns"], slow["rank"], slow["host"], slow["pid"], slow["process"],
            slow["service"], slow["thread_id"]) == ("cudaMemcpyAsync", otlp_job.SLOW[2], 2, "node-1", 1002,
                                                    "python3", "train", 2002)
    assert slow["end_ns"] - slow["start_ns"] == slow["duration_ns"] and len(slow["trace_id"]) == 32
    assert json.loads(slow["attributes"]) == {"cuda.bytes": 4096, "thread.id": 2002}
    assert json.loads(slow["resource"])["ml.world_size"] == otlp_job.RANKS
    errors = [r for r in rows if r["status"] == "error"]
    assert len(errors) == otlp_job.RANKS and errors[0]["status_message"] == "cudaErrorInsufficientDriver"
    partial = next(r for r in rows if "nccl.partial" in json.loads(r["attributes"]))
    assert partial["rank"] is None and partial["parent_span_id"] is None and partial["host"] == "gw"
    assert json.loads(partial["events"])[0]["name"] == "nccl.desync"
    assert all(r["container_id"] is None and r["pod"] is None and r["hw_id"] is None for r in rows)


def test_metrics_table_has_one_row_per_point_with_histogram_sums(tmp_path: Path) -> None:
    otlp_job.write_job(tmp_path / "in", collectives=2)
    metrics = pq.read_table(write_otlp_parquet(tmp_path / "in", tmp_path / "out")["metrics"])
    assert tuple(metrics.column_names) == METRIC_COLUMNS
    rows = metrics.to_pylist()
    assert len(rows) == otlp_job.RANKS * 2 * 2 + 1
    hist = [r for r in rows if r["name"] == "gpu.cuda.memory.copies" and r["rank"] == 0]
    assert [(r["kind"], r["value"], r["count"], r["sum"], r["unit"]) for r in hist] == [
        ("histogram", None, 1, 4096.0, "By"), ("histogram", None, 2, 4096.0 * 3, "By")]
    assert sum(hist[-1]["bucket_counts"]) == 2 and len(hist[-1]["bounds"]) + 1 == len(hist[-1]["bucket_counts"])
    launches = [r["value"] for r in rows if r["name"] == "gpu.cuda.kernel.launch.calls" and r["rank"] == 3]
    assert launches == [10.0, 30.0]
    drop = next(r for r in rows if r["name"] == "otel_ebpf.events.dropped")
    assert (drop["value"], drop["temporality"], drop["monotonic"]) == (otlp_job.DROPPED, "cumulative", True)
    assert json.loads(drop["attributes"]) == {"receiver": "cuda", "reason": "ringbuf_full"}


def test_polars_reads_the_files_as_documented(tmp_path: Path) -> None:
    import polars as pl  # a test dependency (pyproject: test extra)

    otlp_job.write_job(tmp_path / "in", collectives=3)
    write_otlp_parquet(tmp_path / "in", tmp_path / "out")
    spans = pl.read_parquet(tmp_path / "out" / "spans.parquet")
    per_rank = (spans.filter(pl.col("name") == "ncclAllReduce").group_by("rank")
                .agg(pl.len().alias("n")).sort("rank"))
    assert per_rank.to_dicts() == [{"rank": 0, "n": 3}, {"rank": 1, "n": 2}, {"rank": 2, "n": 3}, {"rank": 3, "n": 3}]
    seq = spans.select(pl.col("attributes").str.json_path_match("$['nccl.seq']").cast(pl.Int64).alias("seq"))
    assert sorted(seq.drop_nulls()["seq"].unique().to_list()) == [0, 1, 2]
    assert "json_path_match(\"$['nccl.seq']\")" in DOCS.read_text()  # the documented example is this one


def test_typed_events_go_to_one_file_per_type(tmp_path: Path) -> None:
    memcpy = MemcpyCall(pid=1, tid=2, api="cudaMemcpy", device=-1, start_ns=10, end_ns=20, rc=35, dst=0x7F00,
                        src=0x7E00, bytes=65536, stream=0, kind=1)
    launch = KernelLaunch(pid=1, tid=2, api="cudaLaunchKernel", device=0, time_ns=5, func=0xFFFF_FFFF_FFFF_FFF0,
                          grid=(7, 3, 2), block=(128, 2, 1), shared_mem=256, stream=0, seq=1)
    span = SpanRecord(pid=1, name="cudaMemcpy", start_ns=10, end_ns=20, attributes={"cuda.bytes": 65536},
                      trace_id=2**127 + 5, span_id=9, events=(SpanEventRecord("e", 15, {"k": "v"}),))
    paths = write_events([memcpy, launch, span, memcpy, "not a dataclass"], tmp_path)
    assert sorted(paths) == ["KernelLaunch", "MemcpyCall", "SpanRecord"]
    rows = pq.read_table(paths["MemcpyCall"]).to_pylist()
    assert len(rows) == 2 and rows[0]["bytes"] == 65536 and rows[0]["dst"] == 0x7F00
    k = pq.read_table(paths["KernelLaunch"]).to_pylist()[0]
    assert k["grid"] == [7, 3, 2] and k["func"] == str(0xFFFF_FFFF_FFFF_FFF0)  # beyond int64: decimal text
    s = pq.read_table(paths["SpanRecord"]).to_pylist()[0]
    assert s["trace_id"] == format(2**127 + 5, "032x") and s["span_id"] == "0000000000000009"
    assert json.loads(s["attributes"]) == {"cuda.bytes": 65536}
    assert json.loads(s["events"]) == [{"name": "e", "time_ns": 15, "attributes": {"k": "v"}}]


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = otlp_job.write_job(tmp_path / "in", collectives=2)
    assert main(["export", "--parquet", str(tmp_path / "out"), str(tmp_path / "in")]) == 0
    assert pq.read_table(tmp_path / "out" / "spans.parquet").num_rows == job.spans
    assert main(["export", "--parquet", str(tmp_path / "out"), str(tmp_path / "missing")]) == 1
    assert "no OTLP JSON lines" in capsys.readouterr().err


def test_recorded_demo_joined_collectives_have_no_rank(tmp_path: Path) -> None:
    demo = Path(__file__).parent / "data" / "demo_kill"  # see test_report.py
    rows = pq.read_table(write_otlp_parquet(demo, tmp_path)["spans"]).to_pylist()
    roots = [r for r in rows if r["name"].startswith("nccl ")]
    # the gateway puts a joined collective on one rank's resource: that is not the collective's rank
    assert roots and all(r["rank"] is None and "ml.rank" in json.loads(r["resource"]) for r in roots)
    assert {r["rank"] for r in rows if r["name"] == "ncclAllReduce"} == {0, 1, 2, 3}
