"""Real PyTorch's grouped send/recv, simulated groups and ``shrink_group``, traced: ``otel-ebpf run`` on the twin
(4 ranks) runs tests/twin/programs/p2p_ops.py, and its spans go through the gateway's collective_join.

* uneven ``all_to_all_single``, ``gather``, ``scatter``, a ``batch_isend_irecv`` ring and a blocking
  ``send``/``recv`` (each an NCCL group of ncclSend/ncclRecv per rank) give one ``nccl GroupP2P`` instance each,
  containing exactly the ranks involved, complete;
* the ``all_reduce`` inside ``_time_estimator`` (ncclGroupSimulateEnd) is marked ``nccl.simulated``, counted in no
  ``nccl.calls``, and the real ``all_reduce`` after it joins all 4 ranks (its number was given back);
* every collective on the ``shrink_group`` communicator (ncclCommShrink) has torch's rank and size;
* nothing is counted as ``otel_ebpf.nccl.unjoined``.
"""
from __future__ import annotations

import json
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.emit.otlp_in import spans_from_request
from otel_ebpf.processors.collective_join import CollectiveJoin, Config
from otel_ebpf.twin import TwinEnv
from tests.support.otlp_sink import decode_attrs, metrics_from_jsonl, requests_from_jsonl
from tests.twin.conftest import PROGRAMS
from tests.twin.support import traced_run


def gateway(agent_out: Path) -> list[ReadableSpan]:
    """The agent's spans through the collective_join, as the gateway would see them (then shut down)."""
    spans: list[ReadableSpan] = []
    for request in requests_from_jsonl(agent_out / "traces.jsonl"):
        if isinstance(request, ExportTraceServiceRequest):
            spans += spans_from_request(request)[0]
    sink = ListConsumer()
    join = CollectiveJoin(Config(), Context(), sink, clock=lambda: 0.0)
    join.consume(spans)
    join.shutdown()
    return [s for s in sink.take() if isinstance(s, ReadableSpan)]


def metric_sum(agent_out: Path, name: str, **attrs: object) -> float:
    """A cumulative (float or int) Sum over the points matching ``attrs``: each resource's (process's) last
    value, summed over resources."""
    last: dict[str, float] = {}
    for res, m in metrics_from_jsonl(agent_out / "metrics.jsonl"):
        if m.name == name:
            value = sum(dp.as_double or dp.as_int for dp in m.sum.data_points
                        if all(decode_attrs(dp.attributes).get(k) == v for k, v in attrs.items()))
            key = json.dumps(res, sort_keys=True, default=str)
            last[key] = max(last.get(key, 0.0), value)
    return sum(last.values())


def test_grouped_p2p_simulated_groups_and_shrink_of_real_torch(twin: TwinEnv, libdir: Path, tmp_path: Path) -> None:
    agent_out = tmp_path / "agent"
    run = traced_run(twin, libdir, PROGRAMS / "p2p_ops.py", 4, tmp_path, agent_out)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    views = {v["pid"]: v for v in (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4))}
    assert all(v["estimated"] for v in views.values())
    out = gateway(agent_out)

    roots = [s for s in out if s.name == "nccl GroupP2P"]
    assert sorted(tuple(r.attributes["nccl.group.ranks"]) for r in roots) == [(0, 1, 2, 3)] * 4 + [(0, 3)]
    assert not [r for r in roots if r.attributes.get("nccl.partial")]
    for root in roots:  # every member of the instance is on a rank the root names
        members = [s for s in out if s.context.trace_id == root.context.trace_id and s.name in ("ncclSend", "ncclRecv")]
        assert members and {views[s.resource.attributes["process.pid"]]["rank"] for s in members} == set(
            root.attributes["nccl.group.ranks"])

    reduces = [s for s in out if s.name == "ncclAllReduce"]
    simulated = [s for s in reduces if s.attributes.get("nccl.simulated")]
    assert len(simulated) == 4 and all(s.parent is None and "nccl.seq" not in s.attributes for s in simulated)
    world = [s for s in reduces if not s.attributes.get("nccl.simulated") and s.attributes["nccl.nranks"] == 4]
    assert {s.attributes["nccl.seq"] for s in world} == {0} and len({s.context.trace_id for s in world}) == 1
    (world_root,) = [s for s in out if s.name == "nccl AllReduce" and s.context.trace_id == world[0].context.trace_id]
    assert world_root.attributes["nccl.ranks.arrived"] == 4 and not world_root.attributes.get("nccl.partial")

    shrunk = [s for s in reduces if s.attributes.get("nccl.nranks") == 3]
    assert sorted((views[s.resource.attributes["process.pid"]]["shrunk"], [s.attributes["nccl.rank"], 3])
                  for s in shrunk) == sorted(([r, 3], [r, 3]) for r in range(3))
    assert metric_sum(agent_out, "nccl.calls", **{"nccl.op": "AllReduce"}) == 4 + 3  # the simulated not counted
    assert metric_sum(agent_out, "otel_ebpf.nccl.unjoined") == 0
