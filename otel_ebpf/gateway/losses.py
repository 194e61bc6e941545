"""End-to-end loss accounting at the gateway: one counter for every event lost on the way, by
the layer that lost it.

``otel_ebpf.events.lost{layer, receiver, reason}`` (unit ``{event}``, monotonic):

* ``layer=gateway``: every ``otel_ebpf.events.dropped`` the gateway counts itself (its queues,
  its exporters' span and log queues and failed exports, malformed spans and log records),
  mirrored as it is counted (:class:`GatewayTelemetry`).
* ``layer=agent``: the agents' own ``otel_ebpf.events.dropped{receiver, reason}``, read from the
  OTLP metrics they send through the gateway (:class:`AgentLossLedger`), summed over agents.
  Cumulative series are turned into increments per (agent resource, attributes); a value below
  the last one, or a new start time, is a restarted agent: its new value counts in full.
  Delta series count as they come. The same cumulative point sent twice (a retry) adds nothing.

An exporter's lost log records carry ``signal=logs`` in ``otel_ebpf.events.dropped`` (its spans
no signal); ``otel_ebpf.events.lost`` keeps that attribute, so ``signal="logs"`` selects them.

Not counted: reasons that lose nothing (``NOT_LOST_REASONS`` in otel_ebpf/core/telemetry.py, the
one list the run summary and the HTML report read too: deep stacks not nested, state freed);
requests the gateway refused (``otel_ebpf.events.refused``): the agent retries them, and counts
them dropped if it gives up, so they arrive here as ``layer=agent`` losses. Agents' drops count
*events* (a ring-buffer record dropped before it became a span counts as one), so this is an
upper bound on spans lost.

Bounds: the ledger remembers at most ``max_series`` (agent, series) baselines, least recently
updated forgotten first (counted in ``otel_ebpf.gateway.loss_series.evicted``); a forgotten
series reported again counts its whole value again, so size it above agents x drop series.

Thread safety: both classes may be used from any thread (one lock each).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from otel_ebpf.core.telemetry import DROPPED, LOST, Telemetry, is_lost

__all__ = ["AgentLossLedger", "GatewayTelemetry"]

_CUMULATIVE = 2  # opentelemetry.proto.metrics.v1.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_EVICTED = "otel_ebpf.gateway.loss_series.evicted"


class GatewayTelemetry(Telemetry):
    """The gateway's Telemetry: each ``otel_ebpf.events.dropped`` it counts is also counted as
    ``otel_ebpf.events.lost{layer=gateway}`` (unless its reason is not a loss: ``is_lost``), with its
    ``signal`` when it has one."""

    def add(self, name: str, value: int = 1, **attrs: str) -> None:
        super().add(name, value, **attrs)
        if name == DROPPED and value > 0 and is_lost(attrs.get("reason", "")):
            signal = {"signal": attrs["signal"]} if "signal" in attrs else {}
            super().add(LOST, value, layer="gateway", receiver=attrs.get("receiver", ""),
                        reason=attrs.get("reason", ""), **signal)


def _resource_key(attributes: Iterable[Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((kv.key, str(kv.value).strip()) for kv in attributes))


class AgentLossLedger:
    """Reads the agents' drop counters from OTLP metrics requests into ``otel_ebpf.events.lost``."""

    def __init__(self, telemetry: Telemetry, *, max_series: int = 16384) -> None:
        if max_series < 1:
            raise ValueError("max_series must be >= 1")
        self._telemetry = telemetry
        self._max = max_series
        self._lock = threading.Lock()
        # (resource, point attributes) -> (start time ns, last cumulative value)
        self._last: OrderedDict[tuple[Any, ...], tuple[int, int]] = OrderedDict()

    def observe(self, request: Any) -> int:
        """Count the increments of every ``otel_ebpf.events.dropped`` point in ``request`` (an
        ``ExportMetricsServiceRequest``); returns how many events that added. Never raises for
        an odd point: points that are not an integer sum are skipped."""
        added = 0
        for rm in request.resource_metrics:
            resource: tuple[tuple[str, str], ...] | None = None
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name != DROPPED or metric.WhichOneof("data") != "sum":
                        continue
                    if resource is None:
                        resource = _resource_key(rm.resource.attributes)
                    cumulative = metric.sum.aggregation_temporality == _CUMULATIVE
                    for dp in metric.sum.data_points:
                        added += self._point(resource, dp, cumulative)
        return added

    def _point(self, resource: tuple[tuple[str, str], ...], dp: Any, cumulative: bool) -> int:
        if dp.WhichOneof("value") != "as_int" or dp.as_int <= 0:
            return 0
        attrs = {kv.key: kv.value.string_value for kv in dp.attributes}
        receiver, reason = attrs.get("receiver", ""), attrs.get("reason", "")
        if not is_lost(reason):
            return 0
        signal = {"signal": attrs["signal"]} if "signal" in attrs else {}
        value: int = dp.as_int
        if cumulative:  # keyed by every attribute: an exporter's span and log drops are two series
            key = (resource, tuple(sorted(attrs.items())))
            with self._lock:
                start, last = self._last.pop(key, (dp.start_time_unix_nano, 0))
                restarted = value < last or start != dp.start_time_unix_nano
                increment = value if restarted else value - last
                self._last[key] = (dp.start_time_unix_nano, value)
                evicted = 0
                while len(self._last) > self._max:
                    self._last.popitem(last=False)
                    evicted += 1
            self._telemetry.add(_EVICTED, evicted)
        else:
            increment = value
        self._telemetry.add(LOST, increment, layer="agent", receiver=receiver, reason=reason, **signal)
        return increment
