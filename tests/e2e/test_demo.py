"""``otel-ebpf demo`` as a user runs it: two "nodes" (network + UTS namespaces), an agent per node
tracing real rank processes (the real libcudart, the stand-in libnccl), the gateway joining
every collective; asserted on the gateway's OTLP JSON lines. Needs root and BCC (runs in CI).

Exit code contract checked here: 0 when the job ran as asked, also with an injected crash
(--kill-rank): the crash is the thing being demonstrated, reported in the files and the summary.
Each run takes ~30 s, most of it the agents detaching their uprobes at the end.
"""
from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.support.otlp_sink import decode_attrs, spans_from_jsonl

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]


def demo(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_ebpf", "demo", "--nodes", "2", "--ranks-per-node", "2",
                           "--output", str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=200)


def collectives(out: Path) -> dict[bytes, list[tuple[dict[str, Any], Any, dict[str, Any]]]]:
    """trace id -> [(resource, span, span attributes)] of every span with nccl.comm.id and nccl.seq."""
    traces: dict[bytes, list[tuple[dict[str, Any], Any, dict[str, Any]]]] = defaultdict(list)
    for resource, _scope, span in spans_from_jsonl(out / "traces.jsonl"):
        attrs = decode_attrs(span.attributes)
        if "nccl.comm.id" in attrs and "nccl.seq" in attrs:
            traces[span.trace_id].append((resource, span, attrs))
    return traces


def roots(traces: dict[bytes, list[tuple[dict[str, Any], Any, dict[str, Any]]]]) -> list[tuple[Any, dict]]:
    return [(span, attrs) for spans in traces.values() for _r, span, attrs in spans if not span.parent_span_id]


def no_demo_namespaces() -> bool:
    """Nothing left behind: no oe-demo-* namespace, no oe<run>h<i> veth."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10).stdout
    return "oe-demo-" not in listing and not re.search(r"^\d+:\s+oe[0-9a-f]+[hn]\d+", links, re.M)


def test_demo_joins_every_collective_across_nodes_and_names_the_straggler(bpf_ready: None, tmp_path: Path) -> None:
    run = demo(tmp_path / "out", "--steps", "6", "--straggler", "3")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "summary:" in run.stdout and "straggler: rank 3 on node-1" in run.stdout, run.stdout
    # the sched receiver's step figures, joined by the gateway: rank 3 computes 30 ms longer
    assert re.search(r"why late: in the step before, rank 3 spent on-CPU [1-9]\d\.\d ms", run.stdout), run.stdout
    traces = collectives(tmp_path / "out")
    assert len(traces) == 7, run.stdout  # 6 AllReduce + 1 Broadcast (every 4th step)
    page = (tmp_path / "out" / "report.html").read_text()  # the first run leaves a report to open
    assert str(tmp_path / "out" / "report.html") in run.stdout and '"straggler"' in page
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="https?://', page)  # opens offline
    for spans in traces.values():
        ids = {span.span_id for _r, span, _a in spans}
        assert all(span.parent_span_id in ids for _r, span, _a in spans if span.parent_span_id)
        ranks = {a["nccl.rank"]: r["host.name"] for r, _s, a in spans if "nccl.rank" in a}
        assert ranks == {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}, spans
        assert len(spans) == 5  # 4 rank spans + the root
    complete = [a for _s, a in roots(traces) if not a.get("nccl.partial")]
    assert len(complete) == 7 and all(a["nccl.ranks.arrived"] == 4 for a in complete)
    late = [a["nccl.straggler.rank"] for a in complete]
    assert late.count(3) >= len(late) - 1, late  # 30 ms late every time; allow one scheduling outlier
    assert {a["nccl.straggler.host"] for a in complete if a["nccl.straggler.rank"] == 3} == {"node-1"}
    assert no_demo_namespaces()


def test_demo_crash_is_reported_as_a_partial_collective_and_a_desync(bpf_ready: None, tmp_path: Path) -> None:
    run = demo(tmp_path / "out", "--steps", "4", "--kill-rank", "1", "--kill-after-step", "2")
    assert run.returncode == 0, run.stdout + run.stderr  # the injected crash is reported, not an error
    assert "injected crash of rank 1: FOUND" in run.stdout, run.stdout
    partial = [(span, a) for span, a in roots(collectives(tmp_path / "out")) if a.get("nccl.partial")]
    assert partial, run.stdout
    span, attrs = min(partial, key=lambda p: p[1]["nccl.seq"])
    assert attrs["nccl.seq"] == 2 and list(attrs["nccl.missing_ranks"]) == [1]  # step 3's AllReduce
    desync = [decode_attrs(e.attributes) for e in span.events if e.name == "nccl.desync"]
    assert desync and 1 in desync[0]["nccl.missing_ranks"] and desync[0]["nccl.missing.hosts"] == ["node-0"]
    assert no_demo_namespaces()
