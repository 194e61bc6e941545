"""ProbeHit (otel_ebpf/receivers/probes) -> SpanRecord / MetricRecord; everything else passes unchanged.

* span entries: one span ``<name>`` (scope ``otel_ebpf.probes``) from entry to return with
  attributes ``probe.arg.<arg>`` and ``thread.id``.
* ``metric: count``: counter ``<name>`` {call}; ``histogram``: ``<name>`` as a histogram of
  the ``value`` argument (unit 1) or of the span's duration (s).

Threading: single-threaded (the pipeline worker); ``consume`` never raises.
"""
from __future__ import annotations

from typing import Any

from otel_ebpf.core.events import MetricRecord, SpanRecord
from otel_ebpf.core.processing import EventProcessor, handles

from ...receivers.probes.events import ProbeHit
from .config import Config

__all__ = ["SCOPE", "UserProbesProcessor"]

SCOPE = "otel_ebpf.probes"


class UserProbesProcessor(EventProcessor[Config]):
    """Processor ``probes``."""

    NAME = "probes"

    @handles(ProbeHit)
    def _hit(self, ev: ProbeHit, out: list[object]) -> None:
        attrs: dict[str, Any] = {f"probe.arg.{k}": v for k, v in ev.args}
        if ev.span:
            out.append(SpanRecord(ev.pid, ev.probe, ev.start_ns, ev.end_ns, {**attrs, "thread.id": ev.tid},
                                  scope=SCOPE))
        mattrs = attrs if self.config.metric_attributes else {}
        if ev.metric == "count":
            out.append(MetricRecord(ev.pid, ev.probe, "counter", 1, mattrs, unit="{call}",
                                    description=f"Hits of user probe {ev.probe}.", scope=SCOPE))
        elif ev.metric == "histogram":
            if ev.value:
                value = dict(ev.args).get(ev.value)
                if isinstance(value, bool) or not isinstance(value, int):
                    self._telemetry.dropped(self.NAME, "bad_event")
                    return
                mattrs = {k: v for k, v in mattrs.items() if k != f"probe.arg.{ev.value}"}
                out.append(MetricRecord(ev.pid, ev.probe, "histogram", value, mattrs, unit="1",
                                        description=f"Values of {ev.value} at user probe {ev.probe}.",
                                        scope=SCOPE))
            else:
                out.append(MetricRecord(ev.pid, ev.probe, "histogram", (ev.end_ns - ev.start_ns) / 1e9, mattrs,
                                        unit="s", description=f"Duration of {ev.probe} calls.", scope=SCOPE))
