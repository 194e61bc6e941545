"""otel_ebpf.report on a CPU PyTorch job (tests/unit/report/cpu_job.py: no GPU, no NCCL): one lane
per process with rows per thread and source, the process's lifetime as a bracket, the time span
from the first span to the last, metric sections named for what they hold, up-down counters as
current values without their drop to 0 at exit, metrics read too few times listed as values."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.report import model, read_otlp_json, write_report
from otel_ebpf.report.charts import SECTIONS
from otel_ebpf.report.otlpfiles import SpanRow
from otel_ebpf.report.timeline import MAX_LEVELS, lanes_and_spans
from tests.unit.report import cpu_job

DATA = Path(__file__).parent / "data"


@pytest.fixture
def job(tmp_path: Path) -> cpu_job.Job:
    return cpu_job.write_job(tmp_path)


@pytest.fixture
def built(job: cpu_job.Job) -> dict[str, Any]:
    return model.build(read_otlp_json(job.directory))


def test_one_lane_per_process_with_a_row_per_thread_and_source_and_nesting_levels(job: cpu_job.Job,
                                                                                 built: dict[str, Any]) -> None:
    (lane,) = built["lanes"]
    assert lane["label"] == f"{cpu_job.HOST} / {cpu_job.EXE} {cpu_job.PID}" and lane["rank"] is None
    assert [(r["label"], r["levels"]) for r in lane["rows"]] == [
        ("main thread \u00b7 Python", 3), ("main thread \u00b7 torch ops", 2),
        (f"thread {cpu_job.SIDE_TID} \u00b7 Python", 1), (f"thread {cpu_job.SIDE_TID} \u00b7 torch ops", 1)]
    levels = {(s[4], s[1], s[7]) for s in built["spans"]}
    assert levels == {("job.train", 0, 0), ("job.step", 0, 1), ("job.forward", 0, 2), ("linear", 1, 0),
                      ("addmm", 1, 1), ("job.worker", 2, 0), ("mm", 3, 0)}
    assert (built["meta"]["processes"], built["meta"]["threads"]) == (1, 2)


def test_the_process_lifetime_is_the_lanes_bracket_not_a_bar(job: cpu_job.Job, built: dict[str, Any]) -> None:
    (lane,) = built["lanes"]
    assert lane["process"]["name"] == f"process {cpu_job.EXE}"
    assert (lane["process"]["start"], lane["process"]["dur"]) == (0, cpu_job.LIFE_NS / 1e3)
    assert lane["process"]["attrs"]["process.command_line"] == "python train_cpu.py"
    assert len(built["spans"]) == job.spans - 1 and not any(s[4].startswith("process") for s in built["spans"])
    assert built["top_slow"][0]["name"] == "job.train"  # the lifetime is not a call


def test_output_from_before_the_lifecycle_processor_gets_its_bracket_too(job: cpu_job.Job) -> None:
    data = read_otlp_json(job.directory)
    data.spans[:] = [dataclasses.replace(s, scope="otel_ebpf.sched") if s.scope == "otel_ebpf.lifecycle" else s
                     for s in data.spans]
    (lane,) = model.build(data)["lanes"]
    assert lane["process"]["dur"] == cpu_job.LIFE_NS / 1e3


def test_time_span_is_first_span_to_last_span_not_the_agents_metric_readings(job: cpu_job.Job,
                                                                             built: dict[str, Any]) -> None:
    meta = built["meta"]
    assert (meta["t0_ns"], meta["span_us"]) == (job.base_ns, cpu_job.LIFE_NS / 1e3)
    disk = next(c for c in built["charts"] if c["name"] == "system.disk.io")["series"][0]["points"]
    # the host's readings run from before the fork to after the exit (the agent's whole life): 24 s, not 12.8 s
    assert (disk[0][0], disk[-1][0]) == (-9_700_000.0, 14_300_000.0)


def test_metric_sections_say_what_they_hold_and_charts_what_their_values_are(built: dict[str, Any]) -> None:
    charts = {c["name"]: c for c in built["charts"]}
    assert [(SECTIONS[c["section"]][0], c["name"]) for c in built["charts"]] == [
        ("PyTorch metrics", "pytorch.op.duration"), ("Process metrics (per traced process)", "process.cpu.time"),
        ("Process metrics (per traced process)", "process.memory.usage"),
        ("Host metrics (system-wide)", "system.disk.io")]
    rss = charts["process.memory.usage"]
    assert rss["what"] == "current value" and rss["readings"] == len(cpu_job.RSS_MIB)
    assert [p[1] for p in rss["series"][0]["points"]] == [m * 1024 * 1024 for m in cpu_job.RSS_MIB]  # no 0 at exit
    assert rss["note"] == "1 reading after the process exited (back to 0 then) left out"
    assert charts["process.cpu.time"]["what"] == "cumulative total" and not charts["process.cpu.time"]["values"]
    ops = charts["pytorch.op.duration"]
    assert (ops["values"], ops["readings"], ops["what"]) == (True, 2, "sum of observations (cumulative)")


def test_nesting_deeper_than_the_drawn_levels_shares_the_last_level() -> None:
    def span(i: int) -> SpanRow:
        return SpanRow("t", f"{i}", "", f"f{i}", "internal", 1000 + i, 2000 - i, "unset", "", "otel_ebpf.python",
                       {"host.name": "h", "process.pid": 7}, {"thread.id": 7})

    lanes, spans = lanes_and_spans([span(i) for i in range(MAX_LEVELS + 4)], {}, None, 1000)
    assert [s[7] for s in spans] == list(range(MAX_LEVELS)) + [MAX_LEVELS - 1] * 4
    assert lanes[0]["rows"][0]["levels"] == MAX_LEVELS and lanes[0]["label"] == "h / pid 7"


def test_page_script_draws_the_cpu_job_without_nccl_sections(job: cpu_job.Job, tmp_path: Path) -> None:
    if shutil.which("node") is None:  # scripts/setup.sh installs nodejs; CI must run this
        if os.environ.get("CI"):
            pytest.fail("node is not installed: the report page's script cannot be run")
        pytest.skip("node is not installed: the page's script is not run")
    out = write_report(job.directory, tmp_path / "r.html")
    run = subprocess.run(["node", str(DATA / "dom_stand_in.js"), str(out)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    drawn = json.loads(run.stdout)
    assert (drawn["lane_labels"], drawn["row_labels"], drawn["brackets"]) == (1, 4, 1)  # no collectives lane
    assert drawn["bars"] == job.spans - 1 and drawn["coll_bars"] == 0  # the whole run is in view
    assert drawn["sections"] == ["PyTorch metrics", "Process metrics (per traced process)",
                                 "Host metrics (system-wide)"]
    assert (drawn["charts"], drawn["value_tables"], drawn["chart_lines"]) == (4, 1, 3)
    assert drawn["hidden"] == ["sec-skew", "sec-hangs"]
    assert "not recorded by a limit (not lost)" in drawn["summary"]
