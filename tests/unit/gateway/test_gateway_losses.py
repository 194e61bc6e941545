"""otel_ebpf.gateway.losses: otel_ebpf.events.lost{layer} from the gateway's own drops and from the
agents' otel_ebpf.events.dropped, as the agents' SDK encodes them in OTLP."""
from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import Counter, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.resources import Resource

from otel_ebpf.gateway.losses import AgentLossLedger, GatewayTelemetry
from otel_ebpf.core.telemetry import DROPPED, LOST, Telemetry


class FakeAgent:
    """An agent's MeterProvider with its drop counter; ``request()`` is one OTLP metrics export."""

    def __init__(self, host: str, *, delta: bool = False) -> None:
        temporality = {Counter: AggregationTemporality.DELTA} if delta else {}
        self.reader = InMemoryMetricReader(preferred_temporality=temporality)
        self.meters = MeterProvider(resource=Resource.create({"service.name": "otel-ebpf", "host.name": host}),
                                    metric_readers=[self.reader])
        self.dropped = self.meters.get_meter("otel_ebpf.service.agent").create_counter(DROPPED)

    def drop(self, n: int, receiver: str = "cuda", reason: str = "ringbuf_full", **more: str) -> None:
        self.dropped.add(n, {"receiver": receiver, "reason": reason, **more})

    def request(self):
        return encode_metrics(self.reader.get_metrics_data())


def test_cumulative_agent_drops_count_once_per_increment_across_agents_and_retries():
    tel = Telemetry()
    ledger = AgentLossLedger(tel)
    a, b = FakeAgent("node-a"), FakeAgent("node-b")
    a.drop(5)
    b.drop(7, "otlp", "export_failed")
    first = a.request()
    assert ledger.observe(first) == 5 and ledger.observe(b.request()) == 7
    assert ledger.observe(first) == 0  # the same export retried: nothing new
    a.drop(3)
    assert ledger.observe(a.request()) == 3
    assert tel.get(LOST, layer="agent") == 15
    assert tel.get(LOST, layer="agent", receiver="cuda", reason="ringbuf_full") == 8
    assert tel.get(LOST, layer="agent", reason="export_failed") == 7


def test_restarted_agent_counts_its_new_value_in_full():
    tel = Telemetry()
    ledger = AgentLossLedger(tel)
    before = FakeAgent("node-a")
    before.drop(10)
    ledger.observe(before.request())
    after = FakeAgent("node-a")  # same resource, counter back at 0, new start time
    after.drop(4)
    assert ledger.observe(after.request()) == 4 and tel.get(LOST) == 14


def test_delta_points_add_as_they_come_and_not_lost_reasons_are_left_out():
    tel = Telemetry()
    ledger = AgentLossLedger(tel)
    agent = FakeAgent("node-a", delta=True)
    agent.drop(2)
    agent.drop(9, "emit", "process_evicted")  # state freed, nothing lost
    assert ledger.observe(agent.request()) == 2
    agent.drop(2)
    assert ledger.observe(agent.request()) == 2 and tel.get(LOST) == 4


def test_other_metrics_are_ignored_and_the_series_table_is_bounded():
    tel = Telemetry()
    ledger = AgentLossLedger(tel, max_series=1)
    agent = FakeAgent("node-a")
    agent.meters.get_meter("x").create_counter("nccl.calls").add(100)
    agent.drop(1, reason="ringbuf_full")
    agent.drop(1, reason="queue_full")
    assert ledger.observe(agent.request()) == 2
    assert tel.get("otel_ebpf.gateway.loss_series.evicted") == 1


def test_gateway_telemetry_mirrors_its_own_drops_as_lost():
    tel = GatewayTelemetry()
    tel.dropped("traces", "queue_full", 3)
    tel.dropped("otlp", "export_failed", 4)
    tel.dropped("emit", "process_evicted", 5)
    tel.add("otel_ebpf.events.received", 9, receiver="otlp")
    assert tel.get(DROPPED) == 12
    assert tel.get(LOST, layer="gateway") == 7 and tel.get(LOST, layer="gateway", reason="export_failed") == 4
    assert tel.get(LOST, layer="agent") == 0


def test_an_exporters_span_and_log_drops_are_two_series_each_counted_once():
    tel = Telemetry()
    ledger = AgentLossLedger(tel)
    agent = FakeAgent("node-a")
    agent.drop(5, "otlp", "export_queue_full")
    agent.drop(2, "otlp", "export_queue_full", signal="logs")
    assert ledger.observe(agent.request()) == 7
    agent.drop(1, "otlp", "export_queue_full", signal="logs")
    assert ledger.observe(agent.request()) == 1  # not taken for a restart of the span series
    assert tel.get(LOST, layer="agent") == 8 and tel.get(LOST, layer="agent", signal="logs") == 3


def test_gateway_telemetry_keeps_the_signal_of_a_lost_log_record():
    tel = GatewayTelemetry()
    tel.add(DROPPED, 2, receiver="otlp", reason="export_failed", signal="logs")
    tel.dropped("otlp", "export_failed", 4)
    assert tel.get(LOST, layer="gateway", reason="export_failed") == 6
    assert tel.get(LOST, layer="gateway", signal="logs") == 2
