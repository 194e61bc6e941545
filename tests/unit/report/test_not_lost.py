"""Drop reasons that lose nothing (otel_ebpf.core.telemetry.NOT_LOST_REASONS: deep stacks not nested,
process state freed) are read from that one list by the HTML report's cards, the run summary
(Agent.drops / Agent.summary) and the gateway's end-to-end loss count (otel_ebpf.events.lost):
an import of torch that nests past the python receiver's max_depth is not a lost event anywhere."""
from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from otel_ebpf.core.telemetry import DROPPED, LOST, NOT_LOST_REASONS, Telemetry, is_lost
from otel_ebpf.gateway.losses import AgentLossLedger, GatewayTelemetry
from otel_ebpf.report import model, read_otlp_json
from otel_ebpf.service.agent import Agent
from tests.unit.report import cpu_job, otlp_job

DEEP, LOST_N = 86_593, 7


def _drops(tel: Telemetry) -> Telemetry:
    tel.dropped("python", "stack_too_deep", DEEP)
    tel.dropped("emit", "process_evicted", 3)
    tel.dropped("cuda", "ringbuf_full", LOST_N)
    return tel


def test_deep_stacks_and_freed_state_are_not_losses_and_say_why() -> None:
    assert not is_lost("stack_too_deep") and not is_lost("process_evicted")
    assert is_lost("ringbuf_full") and is_lost("export_queue_full") and is_lost("")
    assert all(why for why in NOT_LOST_REASONS.values())  # the report shows the reason's why


def test_run_summary_counts_what_a_limit_left_unrecorded_apart_from_losses() -> None:
    tel = _drops(Telemetry())
    agent = SimpleNamespace(ctx=SimpleNamespace(telemetry=tel), pipelines=[])
    agent.drops = functools.partial(Agent.drops, agent)  # type: ignore[arg-type]
    assert Agent.drops(agent) == {"cuda/ringbuf_full": LOST_N}  # type: ignore[arg-type]
    assert Agent.drops(agent, lost=False) == {"python/stack_too_deep": DEEP,  # type: ignore[arg-type]
                                              "emit/process_evicted": 3}
    summary = Agent.summary(agent)  # type: ignore[arg-type]
    assert (summary["dropped"], summary["not_recorded"]) == (LOST_N, DEEP + 3)
    assert tel.get(DROPPED) == LOST_N + DEEP + 3  # the exported counter keeps every reason


def test_gateway_loss_count_leaves_out_what_was_not_lost() -> None:
    own = _drops(GatewayTelemetry())
    assert own.get(LOST) == own.get(LOST, layer="gateway", reason="ringbuf_full") == LOST_N
    reader = InMemoryMetricReader()
    agent = MeterProvider(resource=Resource.create({"service.name": "otel-ebpf", "host.name": "node-a"}),
                          metric_readers=[reader])
    counter = agent.get_meter("otel_ebpf").create_counter(DROPPED)
    counter.add(DEEP, {"receiver": "python", "reason": "stack_too_deep"})
    counter.add(LOST_N, {"receiver": "cuda", "reason": "ringbuf_full"})
    tel, data = Telemetry(), reader.get_metrics_data()
    assert data is not None
    assert AgentLossLedger(tel).observe(encode_metrics(data)) == LOST_N
    assert tel.get(LOST) == tel.get(LOST, layer="agent", reason="ringbuf_full") == LOST_N
    agent.shutdown()


def test_report_cards_show_deep_stacks_as_not_recorded_and_real_drops_as_lost(tmp_path: Path) -> None:
    cpu_job.write_job(tmp_path / "cpu")
    meta = model.build(read_otlp_json(tmp_path / "cpu"))["meta"]
    assert (meta["dropped"], meta["not_recorded"]) == (0, cpu_job.DEEP_PYTHON + cpu_job.DEEP_TORCH)
    assert {(r["receiver"], r["reason"], r["value"], r["lost"]) for r in meta["dropped_by"]} == {
        ("python", "stack_too_deep", cpu_job.DEEP_PYTHON, False),
        ("torch", "stack_too_deep", cpu_job.DEEP_TORCH, False)}
    assert all(r["why"] == NOT_LOST_REASONS["stack_too_deep"] for r in meta["dropped_by"])
    otlp_job.write_job(tmp_path / "nccl")
    meta = model.build(read_otlp_json(tmp_path / "nccl"))["meta"]
    assert (meta["dropped"], meta["not_recorded"]) == (otlp_job.DROPPED, 0)
    assert [(r["reason"], r["lost"], r["why"]) for r in meta["dropped_by"]] == [("ringbuf_full", True, "")]
