"""otel_ebpf.report.otlpfiles: a directory's logs.jsonl (the file exporter's log records) is read into
LogRows next to its spans and metrics, and a report of such a directory still renders."""
from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.sdk.resources import Resource

from otel_ebpf.core.events import LogRecord
from otel_ebpf.emit.jsonfile import FILES as WRITTEN
from otel_ebpf.emit.jsonfile import JsonLinesLogExporter
from otel_ebpf.emit.logs import LogBuilder
from otel_ebpf.report import read_otlp_json, write_report
from otel_ebpf.report.otlpfiles import FILES, LogRow
from tests.unit.report import otlp_job

T0 = 1_700_000_000_000_000_000


def _write_logs(directory: Path) -> None:
    build = LogBuilder().build
    resource = Resource({"process.pid": 42, "ml.rank": 3})
    JsonLinesLogExporter(directory).export([
        build(LogRecord(pid=42, time_ns=T0 + 5, event_name="otel_ebpf.nccl.rank.stack", body="a\nb",
                        attributes={"nccl.rank": 3, "ranks": (1, 2)}, severity="WARN", scope="otel_ebpf.hang",
                        trace_id=0xAB, span_id=0xCD), resource),
        build(LogRecord(pid=None, time_ns=T0, event_name="otel_ebpf.nccl.straggler", body="rank 3",
                        attributes={}, severity="ERROR"), resource)])


def test_the_reader_reads_every_file_the_file_exporter_writes():
    assert FILES == WRITTEN


def test_log_records_are_read_into_rows_in_time_order(tmp_path: Path) -> None:
    job = otlp_job.write_job(tmp_path, collectives=2)
    _write_logs(tmp_path)
    data = read_otlp_json(tmp_path)
    assert len(data.spans) == job.spans and data.bad_lines == 0
    assert str(tmp_path / "logs.jsonl") in data.files
    straggler, stack = data.logs
    assert straggler == LogRow(time_ns=T0, observed_ns=straggler.observed_ns, severity_text="ERROR",
                               severity_number=17, event_name="otel_ebpf.nccl.straggler", body="rank 3",
                               trace_id="", span_id="", scope="otel_ebpf",
                               resource={"process.pid": 42, "ml.rank": 3}, attributes={})
    assert straggler.observed_ns >= T0
    assert (stack.event_name, stack.body, stack.severity_number, stack.scope) == \
        ("otel_ebpf.nccl.rank.stack", "a\nb", 13, "otel_ebpf.hang")
    assert (stack.trace_id, stack.span_id) == ("000000000000000000000000000000ab", "00000000000000cd")
    assert stack.attributes == {"nccl.rank": 3, "ranks": (1, 2)}


def test_severity_spelled_by_name_is_read_as_its_number(tmp_path: Path) -> None:
    line = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"severityNumber": "SEVERITY_NUMBER_WARN2", "body": {"stringValue": "x"}},
        {"severityNumber": "SEVERITY_NUMBER_BOGUS"}]}]}]}
    (tmp_path / "logs.jsonl").write_text(json.dumps(line) + "\n")
    data = read_otlp_json(tmp_path / "logs.jsonl")
    assert [(r.severity_number, r.body) for r in data.logs] == [(14, "x"), (0, None)] and data.bad_lines == 0


def test_a_report_of_a_directory_with_logs_renders(tmp_path: Path) -> None:
    otlp_job.write_job(tmp_path, collectives=2)
    _write_logs(tmp_path)
    page = write_report(tmp_path, tmp_path / "report.html")
    assert page.stat().st_size > 0
