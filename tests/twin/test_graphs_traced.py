"""The agent on real ``torch.cuda.graph`` (torch 2.11 on the twin, 2 ranks, NCCL; tests/twin/programs/graphs.py):
what a capture records is marked captured, not counted as run, and each replay is counted (issue 15). The twin's
stand-in runtime counts the launch calls it recorded into graphs (``captured_launches``) and the replays
(``graph_launches``); the agent's ``gpu.cuda.kernel.launch.calls{cuda.graph.captured=true}`` and
``gpu.cuda.graph.launch.calls`` must say the same, and the two all_reduces made inside the capture must be
``nccl.captured`` spans with no join ids, counted in ``nccl.captured.calls`` and not in ``nccl.calls``. Needs root
and BCC."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.twin import TwinEnv
from tests.support.otlp_sink import decode_attrs, metrics_from_jsonl, spans_from_jsonl
from tests.twin.conftest import PROGRAMS
from tests.twin.support import traced_run

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(400)]
NRANKS, REPLAYS, CAPTURED_ALL_REDUCES = 2, 3, 2


def _last(metrics: list, name: str) -> dict[tuple, tuple[dict[str, Any], float]]:
    """{(resource, attributes): (attributes, last cumulative value)} of each series of Sum metric ``name``."""
    last: dict[tuple, tuple[dict[str, Any], float]] = {}
    for resource, m in metrics:
        if m.name == name:
            for dp in m.sum.data_points:
                attrs = decode_attrs(dp.attributes)
                key = (tuple(sorted(map(str, resource.items()))), tuple(sorted(attrs.items())))
                last[key] = attrs, dp.as_int if dp.HasField("as_int") else dp.as_double
    return last


def _total(metrics: list, name: str, **match: Any) -> float:
    return sum(v for attrs, v in _last(metrics, name).values() if all(attrs.get(a) == b for a, b in match.items()))


def test_captured_work_is_marked_and_replays_counted(bpf_ready: None, twin: TwinEnv, libdir: Path,
                                                     tmp_path: Path) -> None:
    stats, agent_out = tmp_path / "stats", tmp_path / "agent"
    stats.mkdir()
    run = traced_run(twin, libdir, PROGRAMS / "graphs.py", NRANKS, tmp_path, agent_out,
                     {"OTEL_EBPF_TWIN_STATS": str(stats)})
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    for r in range(NRANKS):  # the program's own checks ran: the replays moved the data, the capture did not
        assert (tmp_path / f"rank{r}.refused.json").exists()
    counted: dict[str, int] = {}
    for f in stats.glob("cudart-*.txt"):
        for line in f.read_text().splitlines():
            key, value = line.split()
            counted[key] = counted.get(key, 0) + int(value)
    assert counted["captured_launches"] >= 3 * NRANKS and counted["graph_launches"] == REPLAYS * NRANKS, counted

    metrics = metrics_from_jsonl(agent_out / "metrics.jsonl")
    launches = _total(metrics, "gpu.cuda.kernel.launch.calls")
    captured = _total(metrics, "gpu.cuda.kernel.launch.calls", **{"cuda.graph.captured": True})
    assert launches == counted["kernel_launches"], (launches, counted)
    assert captured == counted["captured_launches"], (captured, counted)
    assert _total(metrics, "gpu.cuda.graph.launch.calls") == counted["graph_launches"]
    begins = _total(metrics, "gpu.cuda.api.calls", **{"cuda.api": "cudaStreamBeginCapture"})
    assert begins >= 4 * NRANKS  # per rank: the graph, the two refused captures, and the ctypes one (+ its refusals)

    assert _total(metrics, "nccl.captured.calls") == CAPTURED_ALL_REDUCES * NRANKS
    spans = [(decode_attrs(s.attributes), s) for _, _, s in spans_from_jsonl(agent_out / "traces.jsonl")
             if s.name == "ncclAllReduce"]
    marked = [(a, s) for a, s in spans if a.get("nccl.captured") is True]
    assert len(marked) == CAPTURED_ALL_REDUCES * NRANKS, [a for a, _ in spans]
    assert all("nccl.seq" in a and not s.parent_span_id for a, s in marked)
    ran = [a for a, _ in spans if "nccl.captured" not in a]
    assert ran and _total(metrics, "nccl.calls", **{"nccl.op": "AllReduce"}) == len(ran), (len(ran), ran)
    print(f"torch.cuda.graph on the twin: the stand-in counted {counted}; the agent {captured:.0f} captured launches "
          f"of {launches:.0f}, {len(marked)} captured all_reduces, {len(ran)} that ran")
