"""The agent's own counters (drops, receipts, attach failures), exported as OTel metrics.

Every bounded queue, map and cache in otel-ebpf counts what it drops here, so no drop is
silent. Thread-safe: any thread may :meth:`Telemetry.add`; emit reads :meth:`snapshot`.

Metric names (all on the agent's own resource, ``service.name=otel-ebpf``):

* ``otel_ebpf.events.received`` {receiver}: events read from a receiver.
* ``otel_ebpf.events.dropped`` {receiver, reason}: events lost, and why
  (``ringbuf_full``, ``queue_full``, ``map_full``, ``decode_error``, ``process_cache``...), and
  events left unrecorded by a limit the config sets, which lose nothing asked for
  (:data:`NOT_LOST_REASONS`: every summary, report and loss count reads them apart from losses).
* ``otel_ebpf.events.refused`` {receiver, signal}: spans / metric points / log records an OTLP receiver
  (the gateway's) refused for lack of room, answering UNAVAILABLE / 503 so the sender retries them.
* ``otel_ebpf.events.lost`` {layer, receiver, reason}: the gateway's end-to-end loss count, its own
  drops (layer=gateway) plus the drops its agents report (layer=agent): otel_ebpf/gateway/losses.py.
* ``otel_ebpf.probes.attached`` / ``otel_ebpf.probes.failed`` {receiver, library}.
* ``otel_ebpf.export.failed`` {signal, exporter}: export attempts that failed (retries included).
* ``otel_ebpf.metrics.dropped`` {exporter, reason}: metric collections an exporter never sent.
* ``otel_ebpf.nvml.scrape.errors`` {function, error}: NVML calls that failed (otel_ebpf/receivers/nvml).
"""
from __future__ import annotations

import threading
from collections.abc import Mapping

__all__ = ["CACHE_EVICTIONS", "DROPPED", "LOST", "NOT_LOST_REASONS", "RECEIVED", "REFUSED", "Telemetry", "is_lost"]

DROPPED = "otel_ebpf.events.dropped"
RECEIVED = "otel_ebpf.events.received"
REFUSED = "otel_ebpf.events.refused"
LOST = "otel_ebpf.events.lost"
CACHE_EVICTIONS = "otel_ebpf.cache.evictions"  # {cache, reason=full}: a bounded cache's entries dropped for room
# The otel_ebpf.events.dropped reasons that are not data lost: what a limit left unrecorded by design,
# or state freed after its data was sent. The one list the run summary, the HTML report and the gateway's
# otel_ebpf.events.lost read; any other reason is a loss of something that was asked for.
NOT_LOST_REASONS: Mapping[str, str] = {
    # python.bpf.c / torch.bpf.c: a call nested deeper than receivers.<python|torch>.max_depth is counted at
    # entry and never becomes a span; the calls around it are all recorded (importing torch nests ~60 deep).
    "stack_too_deep": "calls nested deeper than the receiver's max_depth: counted, not recorded as spans",
    # emit/emitter.py: a process's meter provider released after its metrics were exported (older agents
    # counted it here; now otel_ebpf.processes.evicted).
    "process_evicted": "a process's metric state freed after its metrics were exported",
}


def is_lost(reason: str) -> bool:
    """Whether an ``otel_ebpf.events.dropped`` reason is data lost (not in :data:`NOT_LOST_REASONS`)."""
    return reason not in NOT_LOST_REASONS


_DESCRIPTIONS = {
    DROPPED: "Events lost before export, by receiver and reason; reasons stack_too_deep and process_evicted "
             "count what a limit left unrecorded or state freed, not data lost.",
    RECEIVED: "Events read from receivers.",
    REFUSED: "Spans, metric points or log records an OTLP receiver refused for lack of room (UNAVAILABLE / 503 "
             "with a retry hint): not lost, the sender retries them or counts them dropped.",
    LOST: "Events lost end to end, by the layer that lost them: the gateway's own drops (layer=gateway) plus "
          "the drops its agents report in their otel_ebpf.events.dropped (layer=agent).",
    "otel_ebpf.probes.attached": "Probes attached, by receiver and library.",
    "otel_ebpf.probes.failed": "Probes that failed to attach, by receiver and library.",
    "otel_ebpf.export.failed": "Export attempts (span batches or metric collections) that failed, retries included.",
    "otel_ebpf.metrics.dropped": "Metric collections an exporter never sent, by exporter and reason "
                                 "(export_queue_full, export_failed, export_shutdown).",
    CACHE_EVICTIONS: "Entries a bounded cache dropped for room, by cache (the agent's resources and exec_hints; the "
                     "gateway's decoder caches otlp_resources and otlp_scopes, cleared whole when full) and reason.",
    "otel_ebpf.sched.switches_missed": "Switch-outs of a traced thread whose switch-in the sched receiver's program "
                                       "did not see (the kernel traced none): that run is missing from its on-CPU "
                                       "time.",
    "otel_ebpf.bpf.runs_skipped": "Runs of a receiver's BPF program the kernel skipped because another BPF program "
                                  "was running on that CPU (the program's recursion_misses), by receiver and "
                                  "program; the kernel does not say whose event each was.",
    "otel_ebpf.clock.steps": "Steps of the wall clock the agent found (NTP's makestep, date -s, a VM resumed), by "
                             "the receiver that found it: span times follow the new wall clock from then on.",
    "otel_ebpf.spans.rate_limited": "Calls left without a span by a receiver's span budget (span_rate_limit); "
                                    "they are still counted in that receiver's metrics, so nothing is lost.",
    "otel_ebpf.nvml.scrape.errors": "NVML calls that failed during a scrape, by function and error; "
                                    "the scrape kept what it could read.",
}


class Telemetry:
    """Monotonic counters keyed by (name, sorted attribute items). Bounded by construction:
    attribute values come from config (receiver ids, reasons, libraries), not from events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}

    def add(self, name: str, value: int = 1, **attrs: str) -> None:
        if value <= 0:
            return
        key = (name, tuple(sorted(attrs.items())))
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + value

    def dropped(self, receiver: str, reason: str, value: int = 1) -> None:
        self.add(DROPPED, value, receiver=receiver, reason=reason)

    def get(self, name: str, **attrs: str) -> int:
        """Sum over all series of ``name`` whose attributes include ``attrs``."""
        want = set(attrs.items())
        with self._lock:
            return sum(v for (n, a), v in self._counts.items() if n == name and want <= set(a))

    def snapshot(self) -> list[tuple[str, Mapping[str, str], int]]:
        with self._lock:
            return [(n, dict(a), v) for (n, a), v in self._counts.items()]

    @staticmethod
    def description(name: str) -> str:
        return _DESCRIPTIONS.get(name, "")
