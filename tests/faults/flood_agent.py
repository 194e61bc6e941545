"""A flooding agent for the gateway backpressure test: the project's Emitter (the agent's emit
stage: per-exporter bounded queues, retry_on_failure, drop counters exported as metrics) fed
SpanRecords at a fixed rate, exporting over OTLP/gRPC to a gateway.

    python -m tests.faults.flood_agent --endpoint http://127.0.0.1:PORT --agent 0 --rate 500 \
        --duration 45 --out result.json

Span ids are ``agent << 40 | seq`` (unique across agents); every span is named ``flood``. On exit
(after the Emitter's shutdown flushed what it could, counting the rest) it writes
``{"sent": N, "dropped": {"receiver/reason": n}}`` to ``--out``. Bounded: it runs ``--duration``
seconds, then at most the Emitter's shutdown_timeout.
"""
from __future__ import annotations

import argparse
import json
import time

from otel_ebpf.core.config import build
from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.emit.exporters import OtlpExporterConfig, build_exporters
from otel_ebpf.core.events import SpanRecord
from otel_ebpf.core.telemetry import DROPPED, Telemetry

_TICK_S = 0.02


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--agent", type=int, required=True)
    ap.add_argument("--rate", type=int, default=500, help="spans per second")
    ap.add_argument("--duration", type=float, default=45.0)
    ap.add_argument("--queue-size", type=int, default=4096)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    cfg = build(OtlpExporterConfig, {"endpoint": args.endpoint, "protocol": "grpc", "timeout": "5s",
                                     "batch": {"queue_size": args.queue_size, "batch_size": 256,
                                               "batch_delay": "200ms"},
                                     "retry_on_failure": {"max_elapsed_time": "20s"}}, "exporters.otlp")
    spans, metrics = build_exporters(cfg)
    host = f"flood-agent-{args.agent}"
    tel = Telemetry()
    emitter = Emitter([ExporterSpec.of("otlp", spans, metrics, cfg)], tel,
                      resource_of=lambda pid, comm: {"service.name": "flood", "host.name": host},
                      agent_attributes={"service.name": "otel-ebpf", "host.name": host}, metrics_interval=1.0,
                      shutdown_timeout=20.0)
    emitter.start()
    per_tick = max(1, int(args.rate * _TICK_S))
    seq = 0
    t0 = time.monotonic()
    next_at = t0
    while time.monotonic() - t0 < args.duration:
        now_ns = time.time_ns()
        batch = [SpanRecord(pid=1000 + args.agent, name="flood", start_ns=now_ns, end_ns=now_ns + 1000,
                            attributes={"flood.seq": seq + i}, span_id=(args.agent + 1) << 40 | (seq + i),
                            trace_id=(args.agent + 1) << 64 | (seq + i))
                 for i in range(per_tick)]
        emitter.consume(batch)
        seq += per_tick
        next_at += _TICK_S
        time.sleep(max(0.0, next_at - time.monotonic()))
    emitter.shutdown()
    dropped = {f"{a.get('receiver')}/{a.get('reason')}": v for n, a, v in tel.snapshot() if n == DROPPED}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"sent": seq, "dropped": dropped}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
