"""The GPU proof kit's reading of cumulative counters (bench/gpu_proof/common.py ``snapshots``).

CI failed once (stop 31) with every twin count exactly doubled: the agent's last periodic export and its flush
at exit landed in the same 10 ms bucket, and the old reader summed the two cumulative values."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "gpu_proof"))

from common import launch_window, snapshots  # noqa: E402


def _export(t_ns: int, series: dict[str, float], pid: int = 1) -> dict:
    points = [{"attributes": [{"key": "cuda.api", "value": {"stringValue": api}}],
               "startTimeUnixNano": "1", "timeUnixNano": str(t_ns), "asDouble": v} for api, v in series.items()]
    metric = {"name": "calls", "unit": "1", "sum": {"dataPoints": points, "isMonotonic": True,
                                                    "aggregationTemporality": 2}}
    return {"resourceMetrics": [{"resource": {"attributes": [{"key": "process.pid", "value": {"intValue": str(pid)}}]},
                                 "scopeMetrics": [{"scope": {"name": "s"}, "metrics": [metric]}]}]}


def _write(tmp: Path, exports: list[dict]) -> Path:
    (tmp / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in exports))
    return tmp


def test_two_exports_in_one_10ms_bucket_are_not_summed(tmp_path: Path) -> None:
    ms = 1_000_000
    out = _write(tmp_path, [_export(1000 * ms, {"cudaLaunchKernel": 100.0}),
                            _export(1100 * ms, {"cudaLaunchKernel": 194.0}),
                            _export(1103 * ms, {"cudaLaunchKernel": 194.0})])  # the flush at exit, 3 ms later
    rows = snapshots(out, "calls", lambda a: True)
    assert rows[-1][1] == 194.0
    assert [v for _, v in rows] == [100.0, 194.0]


def test_series_add_their_latest_values_across_processes(tmp_path: Path) -> None:
    ms = 1_000_000
    out = _write(tmp_path, [_export(1000 * ms, {"a": 1.0, "b": 2.0}, pid=1),
                            _export(1002 * ms, {"a": 5.0}, pid=2),
                            _export(2000 * ms, {"a": 3.0, "b": 4.0}, pid=1)])
    assert snapshots(out, "calls", lambda a: True) == [(1002 * ms, 8.0), (2000 * ms, 12.0)]
    assert snapshots(out, "calls", lambda a: a["cuda.api"] == "a") == [(1002 * ms, 6.0), (2000 * ms, 8.0)]
    assert launch_window(out, "calls", 1500 * ms, 2000 * ms, lambda a: True) == 4
