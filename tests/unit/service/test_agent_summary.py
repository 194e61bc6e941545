"""otel_ebpf.service.agent: the run summary's drop breakdown tells an exporter's lost log records
from its lost spans (both are in otel_ebpf.events.dropped, so both are in the total)."""
from __future__ import annotations

from types import SimpleNamespace

from otel_ebpf.core.telemetry import DROPPED, Telemetry
from otel_ebpf.service.agent import Agent


def test_drops_name_lost_log_records_apart_from_spans():
    tel = Telemetry()
    tel.dropped("otlp", "export_queue_full", 5)
    tel.add(DROPPED, 2, receiver="otlp", reason="export_queue_full", signal="logs")
    tel.dropped("cuda", "ringbuf_full", 1)
    agent = SimpleNamespace(ctx=SimpleNamespace(telemetry=tel))
    assert Agent.drops(agent) == {"otlp/export_queue_full": 5, "otlp/logs/export_queue_full": 2,  # type: ignore[arg-type]
                                  "cuda/ringbuf_full": 1}
    assert tel.get(DROPPED) == 8
