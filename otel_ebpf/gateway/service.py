"""The gateway: OTLP from every node's agent in, NCCL collectives joined, OTLP or files out.

::

    OtlpReceiver -> OtlpIngest -spans+logs-> BoundedQueue(traces) -> collective_join -> ... -> ExportGate -> Forwarder
                               -metrics---> BoundedQueue(metrics) ---------------------------------> Forwarder
    ticker ------------------Tick-------> BoundedQueue(traces)   (timeouts fire while a hung job sends nothing)

Backpressure, end to end: a stalled exporter fills its span queue; the ExportGate then holds the
pipeline worker (up to ``service.max_export_wait``); the trace queue fills; the receiver refuses
requests whole (UNAVAILABLE / 503 with ``retry_after``) and the agents retry. Losses anywhere
are counted in ``otel_ebpf.events.lost{layer}`` (:mod:`otel_ebpf.gateway.losses`).

Received log records (SDK ``ReadableLogRecord``, their resources kept) share the trace queue
and pass through the processors, which pass on what they do not handle; the ExportGate waits for
room in the exporters' span and log queues alike.

Spans, log records and metrics leave through the SDK (:class:`~otel_ebpf.emit.forward.Forwarder`:
each exporter's sending queues, metric exporters as is); the gateway's own metrics (join
metrics, drop counters) go through an :class:`~otel_ebpf.emit.emitter.Emitter` on the
resource ``service.name=otel-ebpf-gateway``.

Start order: emit, processors, queues, ticker, receivers. ``shutdown`` (safe twice and
without start) stops the receivers first, bounds the gate's waits (``_SHUTDOWN_WAIT_S``), then
drains every stage into the next: queued spans are joined, pending collectives released (as
partial), everything flushed.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from otel_ebpf.emit.emitter import Emitter, ExporterSpec
from otel_ebpf.emit.exporters import build_exporters, build_log_exporter, check_output_directory
from otel_ebpf.emit.forward import Forwarder
from otel_ebpf.core.errors import OtelEbpfError
from otel_ebpf.core.events import Tick
from otel_ebpf.gateway import components
from otel_ebpf.gateway.config import GatewayConfig
from otel_ebpf.gateway.exportgate import ExportGate
from otel_ebpf.gateway.losses import AgentLossLedger, GatewayTelemetry
from otel_ebpf.gateway.ingest import OtlpIngest
from otel_ebpf.core.pipeline import BoundedQueue, Consumer, Context
from otel_ebpf.host.identity import gateway_resource_attributes
from otel_ebpf.core.telemetry import CACHE_EVICTIONS, LOST
from otel_ebpf.emit.otlp_in import decoder_cache_evictions

__all__ = ["Gateway"]

log = logging.getLogger(__name__)
_SHUTDOWN_WAIT_S = 10.0  # at shutdown, the longest the gate still waits for exporter room


class Gateway:
    """Builds the one pipeline of ``cfg``; ``start``/``shutdown`` as a component. A ``ctx`` given
    should carry a :class:`GatewayTelemetry`, else the gateway's own drops are not mirrored in
    ``otel_ebpf.events.lost`` (the agents' still are)."""

    def __init__(self, cfg: GatewayConfig, ctx: Context | None = None) -> None:
        self.cfg = cfg
        self.ctx = ctx or Context(telemetry=GatewayTelemetry())
        svc, pipe = cfg.service, cfg.pipeline
        for eid in pipe.exporters:  # every output directory checked before any exporter is made
            check_output_directory(cfg.exporters[eid], f"exporters.{eid}")
        specs = []
        for eid in pipe.exporters:
            ecfg = cfg.exporters[eid]
            spans, metrics = build_exporters(ecfg)
            # batch and retry_on_failure from config
            specs.append(ExporterSpec.of(eid, spans, metrics, ecfg, logs=build_log_exporter(ecfg)))
        emitter = Emitter(specs, self.ctx.telemetry, resource_of=lambda pid, comm: {},
                          agent_attributes=gateway_resource_attributes(), max_processes=1,
                          metrics_interval=svc.metrics_interval, encode_ahead=True)
        self.forwarder = Forwarder(emitter, specs, self.ctx.telemetry)
        self.emitter = emitter
        factories = components.processors()
        self.gate = ExportGate(self.forwarder, lambda: [*emitter.span_queues, *emitter.log_queues],
                               max_wait=svc.max_export_wait)
        nxt: Consumer = self.gate
        self.processors: list[Any] = []
        for proc_id in reversed(pipe.processors):
            proc = factories[proc_id.split("/")[0]].create(cfg.processors[proc_id], self.ctx, nxt)
            self.processors.insert(0, proc)
            nxt = proc
        self.traces = BoundedQueue(nxt, self.ctx.telemetry, max_events=svc.max_queue, name="traces")
        self.metrics = BoundedQueue(self.forwarder, self.ctx.telemetry, max_events=svc.max_metric_queue,
                                    name="metrics")
        self.losses = AgentLossLedger(self.ctx.telemetry)
        rfactories = components.receivers()
        self.receivers = {rid: rfactories[rid.split("/")[0]].create(
            cfg.receivers[rid], self.ctx, OtlpIngest(self.ctx.telemetry, self.traces, self.metrics, name=rid,
                                                     losses=self.losses))
                          for rid in pipe.receivers}
        self._stop = threading.Event()
        self._evictions_seen = decoder_cache_evictions()  # the decoder's caches are the process's: a baseline
        self._ticker: threading.Thread | None = None
        self.health: Any = None  # otel_ebpf.service.health.HealthServer while started

    def _tick(self) -> None:
        while not self._stop.wait(self.cfg.service.tick_interval):
            self.traces.offer([Tick(time.time_ns())])  # a full queue wakes the join anyway: no drop to count
            self.count_cache_evictions()

    def count_cache_evictions(self) -> None:
        """The C decoder's cache clears since the last call (since this service was made, the first time), into
        ``otel_ebpf.cache.evictions{cache=otlp_resources|otlp_scopes, reason=full}``."""
        for cache, n in decoder_cache_evictions().items():
            grown = n - self._evictions_seen.get(cache, 0)
            if grown > 0:
                self._evictions_seen[cache] = n
                self.ctx.telemetry.add(CACHE_EVICTIONS, grown, cache=cache, reason="full")

    def start(self) -> None:
        """Start everything; on a failure stop what started and re-raise (OtlpBindError names
        the endpoint that could not be bound)."""
        try:
            from otel_ebpf.service import health
            self.health = health.serve(self.cfg.service.health_endpoint, health.GATEWAY_DEFAULT,
                                       health.gateway_checks(self), "service.health_endpoint")
            self.forwarder.start()
            for proc in self.processors:
                proc.start()
            self.traces.start()
            self.metrics.start()
            self._ticker = threading.Thread(target=self._tick, name="otel-ebpf-gateway-tick", daemon=True)
            self._ticker.start()
            for r in self.receivers.values():
                r.start()
        except BaseException:
            self.shutdown()
            raise

    def endpoints(self) -> dict[str, tuple[int, int]]:
        """Receiver id -> (bound gRPC port, bound HTTP port); 0 where off."""
        return {rid: (r.grpc_port, r.http_port) for rid, r in self.receivers.items()}

    def shutdown(self) -> None:
        """Stop receiving, then drain and flush every stage. Safe twice and without start."""
        health, self.health = self.health, None
        if health is not None:
            health.shutdown()
        for rid, r in self.receivers.items():
            _quietly(r.shutdown, f"receiver {rid}")
        self.gate.release(_SHUTDOWN_WAIT_S)
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None
        _quietly(self.traces.shutdown, "trace queue")
        for proc in self.processors:
            _quietly(proc.shutdown, "processor")
        _quietly(self.metrics.shutdown, "metrics queue")
        _quietly(self.forwarder.shutdown, "exporters")

    def summary(self) -> dict[str, int]:
        tel = self.ctx.telemetry
        stats = [r.stats for r in self.receivers.values()]
        return {"requests": sum(s.requests for s in stats),
                "rejected": sum(s.rejected_malformed + s.rejected_too_large + s.rejected_unsupported for s in stats),
                "refused": sum(s.refused for s in stats),
                "received": tel.get("otel_ebpf.events.received"),
                "dropped": tel.get("otel_ebpf.events.dropped"),
                "lost": tel.get(LOST),
                "spans": self.forwarder.spans_forwarded,
                "logs": self.forwarder.logs_forwarded}


    def deliveries(self) -> dict[str, dict[str, tuple[int, dict[str, int]]]]:
        """{exporter: {signal: (items sent, {reason: items lost})}}, as the agent's (service.agent)."""
        out: dict[str, dict[str, tuple[int, dict[str, int]]]] = {}
        for name, sig, sent, lost in self.emitter.deliveries():
            out.setdefault(name, {})[sig] = (sent, lost)
        return out


def _quietly(fn: Callable[[], None], what: str) -> None:
    try:
        fn()
    except OtelEbpfError as exc:
        log.warning("%s: %s", what, exc)
    except Exception:
        log.exception("%s failed to stop cleanly", what)
