"""Collective spans from the NCCL profiler plugin alone (issue 16: "plugin events alone are a full source of
collective spans"), on real PyTorch: the sharded job (FSDP2, then HSDP on a (replicate, shard) mesh, whose groups
torch makes with ncclCommSplit) on 2 namespace nodes x 2 ranks, agents with ``receivers.nccl.host_calls: false``
(libnccl not probed, as for an NCCL linked statically). Every collective instance at the gateway is one trace
holding exactly the ranks of one group torch made, each rank's span GPU-timed by the plugin, with NCCL's rank and
size in that group (split children included), and no host-call span anywhere."""
from __future__ import annotations

import pytest

from otel_ebpf.twin import TwinEnv
from otel_ebpf.twin.cluster import ClusterSpec, run_cluster
from tests.support.otlp_sink import decode_attrs, spans_from_jsonl
from tests.twin.conftest import PROGRAMS
from tests.twin.support import gateway_view, membership_problems, rank_records

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(400)]


def test_plugin_only_spans_join_into_one_trace_per_collective_of_each_torch_group(
        bpf_ready: None, twin: TwinEnv, tmp_path) -> None:
    lines: list[str] = []
    args = [str(tmp_path), "--steps", "2", "--phases", "fsdp2,hsdp", "--straggler", "1", "--delay", "0.1"]
    run = run_cluster(ClusterSpec(PROGRAMS / "wl_sharded.py", args, output=tmp_path / "gateway", timeout=300,
                                  nccl_receiver={"host_calls": False}),
                      on_line=lambda i, line: lines.append(f"[node-{i}] {line}"))
    output = "\n".join(lines)[-4000:]
    assert run.returncodes == {0: 0, 1: 0} and not run.timed_out and not run.problems, (run.problems, output)
    view = gateway_view(run.traces, rank_records(tmp_path, 4))
    assert len(view.instances) >= 20, output
    problems = membership_problems(view)
    assert not problems, "\n".join(problems[:20])
    spans = [(span.name, decode_attrs(span.attributes)) for _res, _scope, span in spans_from_jsonl(run.traces)]
    nccl = [(name, a) for name, a in spans if name.startswith("nccl") and not name.startswith("ncclComm")]
    assert not [n for n, a in nccl if a.get("nccl.timing") == "host_enqueue"]  # libnccl was not probed
    ranked = [a for _n, a in nccl if "nccl.rank" in a and "nccl.comm.id" in a]
    assert ranked and all(a["nccl.source"] == "profiler_plugin" and int(a["nccl.gpu.duration_ns"]) > 0
                          and a["nccl.algo"] and str(a["nccl.comm.id"]).endswith("/" + str(a["nccl.op"]))
                          for a in ranked)
