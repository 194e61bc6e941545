"""Namespace nodes, traced end to end (otel_ebpf.twin.cluster): real torch on 2 nodes x 2 ranks, each node's
torchrun under its own ``otel-ebpf run`` agent, one gateway joining every collective across the nodes.
Needs root and BCC (runs in CI)."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.twin import TwinEnv
from otel_ebpf.twin.cluster import ClusterSpec, run_cluster
from tests.support.otlp_sink import decode_attrs, spans_from_jsonl
from tests.twin.conftest import PROGRAMS
from tests.twin.support import slot_cleaned

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(400)]


def joined(traces: Path) -> dict[bytes, list[tuple[dict[str, Any], Any, dict[str, Any]]]]:
    """trace id -> [(resource, span, span attributes)] of every span with nccl.comm.id and nccl.seq."""
    found: dict[bytes, list[tuple[dict[str, Any], Any, dict[str, Any]]]] = defaultdict(list)
    for resource, _scope, span in spans_from_jsonl(traces):
        attrs = decode_attrs(span.attributes)
        if "nccl.comm.id" in attrs and "nccl.seq" in attrs:
            found[span.trace_id].append((resource, span, attrs))
    return found


def test_two_nodes_give_one_joined_trace_per_collective_with_all_four_ranks(
        bpf_ready: None, twin: TwinEnv, libdir: Path, tmp_path: Path) -> None:
    lines: list[tuple[int, str]] = []
    said: list[str] = []
    run = run_cluster(ClusterSpec(PROGRAMS / "cluster_allreduce.py", output=tmp_path / "out", timeout=300),
                      echo=said.append, on_line=lambda i, line: lines.append((i, line)))
    log = "\n".join(f"[{i}] {line}" for i, line in lines)[-6000:]
    assert run.returncodes == {0: 0, 1: 0} and not run.timed_out and not run.problems, log
    sums = sorted(m for _i, line in lines for m in re.findall(r"cluster rank=\d+ host=node-\d+ sum=[\d.]+", line))
    assert sums == [f"cluster rank={r} host=node-{r // 2} sum=10.0" for r in range(4)], log
    traces = joined(run.traces)
    roots = [a for spans in traces.values() for _r, s, a in spans if not s.parent_span_id]
    assert len(roots) == len(traces) and len(roots) >= 3, log  # 3 all_reduces (+ whatever init runs)
    all_reduces = 0
    for spans in traces.values():
        ranks = {a["nccl.rank"]: r["host.name"] for r, _s, a in spans if "nccl.rank" in a}
        assert ranks == {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}, spans
        # each rank's communicator is on its LOCAL_RANK's device: local rank 0 never calls cudaSetDevice
        # (torch skips it on the thread's current device, 0), so its device is CUDA's default
        devices = {a["nccl.rank"]: a.get("nccl.device") for _r, _s, a in spans if "nccl.rank" in a}
        assert devices == {0: 0, 1: 1, 2: 0, 3: 1}, devices
        host = [a for _r, s, a in spans if a.get("nccl.timing") != "gpu"]
        assert len(host) == 5  # 4 rank spans + the root
        # the NCCL profiler plugin (run loads it): each rank's GPU span and the gateway's joined one
        op = host[0]["nccl.op"]
        gpu = sorted(s.name for _r, s, a in spans if a.get("nccl.timing") == "gpu")
        assert gpu == [f"nccl {op} gpu"] + [f"nccl{op} gpu"] * 4, gpu
        all_reduces += any(s.name == "ncclAllReduce" for _r, s, _a in spans)
    assert all_reduces == 3
    assert not any(a.get("nccl.partial") for a in roots)
    assert (run.logs / "node-0.log").exists() and (run.logs / "gateway.log").exists()
    assert slot_cleaned("\n".join(said))
