"""OTLP in: decoded OTLP/protobuf export requests -> OTel SDK objects the SDK exporters take.

* :func:`spans_from_request`: ``ExportTraceServiceRequest`` -> SDK ``ReadableSpan`` list, each
  with its resource, instrumentation scope, ids, parent (``is_remote`` from the span flags),
  kind, status, attributes, events, links and times. A received span was exported, so it was
  sampled: every context gets the SAMPLED flag (the SDK encoder does not send trace flags, and
  the SDK's BatchSpanProcessor drops unsampled spans).
* :func:`metrics_from_request`: ``ExportMetricsServiceRequest`` -> SDK ``MetricsData`` with
  Sum, Gauge and (explicit-bucket) Histogram metrics, temporality and exemplars kept, for
  pass-through to the SDK metric exporters.
* :func:`logs_from_request`: ``ExportLogsServiceRequest`` -> SDK ``ReadableLogRecord`` list, each
  with its resource, instrumentation scope, times, severity (text and number; a number outside
  the OTel range becomes UNSPECIFIED, as an unknown span kind becomes INTERNAL), body (any OTLP
  value: strings, numbers, bytes, arrays as tuples, kvlists as dicts), attributes, event name,
  trace flags and trace/span ids (empty or all-zero: none).

Never raises on bad content (the OTLP server has already rejected undecodable bodies): a span
with invalid ids, a link with invalid ids, a metric of another point type, a malformed point or
a log record with ids of the wrong length is left out and counted in the returned :class:`Drops`
(``malformed_span``, ``malformed_link``, ``unsupported_metric_type`` (points),
``malformed_metric`` (points), ``malformed_log``). Not in the SDK objects: the ``dropped_*_count``
fields (the SDK only derives them from its own attribute limits). Each span keeps its Span message as received
(``RECEIVED_SPAN``, :mod:`.otlp_common`) unless a key came twice or a link was left out: the protobuf encoders
send it on as those bytes (dropped counts and unknown fields kept), with the attributes added to it since.

Requests with one resource or scope repeated are merged per resource and scope, because the
SDK's metrics encoder keys its output by resource and would keep only the last. Pure
functions, thread-safe.

Spans are decoded in C from the request's bytes when the extension is built (``otel_ebpf.emit._otlpdec``: the
same spans, fields and drops as :func:`_spans_in_python` makes of the parsed request, tests/unit/emit/
test_otlpdec.py); a request off its fast path (a trace state...) goes the Python way. The C decoder makes one
:class:`ReceivedResource` (and one ``InstrumentationScope``) for each distinct resource (scope) it has seen, by its
bytes (at most 4,096 of each, then it starts over), and gives it to every request that carries it. The gateway's
per-span cost: bench/gateway_wire.py, docs/benchmarks.md.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from opentelemetry._logs import LogRecord as SdkLogRecord
from opentelemetry._logs import SeverityNumber
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.span import DEFAULT_TRACE_STATE
from opentelemetry.trace.status import Status, StatusCode

from otel_ebpf.emit.logs import log_context
from otel_ebpf.emit.otlp_common import RECEIVED_SPAN

__all__ = ["Drops", "ReceivedResource", "decode_attributes", "logs_from_request", "metrics_from_request",
           "spans_from_bytes", "spans_from_request"]

Drops = Counter[str]  # reason -> items left out
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_HAS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_KINDS = {0: SpanKind.INTERNAL, 1: SpanKind.INTERNAL, 2: SpanKind.SERVER, 3: SpanKind.CLIENT,
          4: SpanKind.PRODUCER, 5: SpanKind.CONSUMER}
_STATUS = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
_TEMPORALITY = {t.value: t for t in AggregationTemporality}
_SEVERITY = {s.value: s for s in SeverityNumber}


class _Malformed(Exception):
    """A span or point that cannot be converted (internal; counted by the caller)."""


# -- common ----------------------------------------------------------------------------------
def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    if kind == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    return getattr(value, kind)


def decode_attributes(key_values: Any) -> dict[str, Any]:
    """OTLP ``KeyValue`` list -> dict (arrays as tuples, kvlists as dicts; later keys win)."""
    return {kv.key: _value(kv.value) for kv in key_values}


class ReceivedResource(Resource):
    """The ``Resource`` of received spans: the SDK's, with its hash kept. An SDK ``Resource`` never changes, and its
    ``__hash__`` JSON-dumps the attributes each time (~2 us); the encoders group every batch's spans by resource
    equality, so a gateway that sends a thousand ranks' spans paid it for each host in each batch
    (bench/gateway_wire.py). Equal to, and hashed as, an SDK ``Resource`` of the same attributes and schema URL."""

    def __hash__(self) -> int:
        h: int | None = self.__dict__.get("_oe_hash")
        if h is None:
            h = self.__dict__["_oe_hash"] = super().__hash__()
        return h


def _resource(pb: Any, schema_url: str) -> Resource:
    return ReceivedResource(decode_attributes(pb.attributes), schema_url or None)


def _scope(pb: Any, schema_url: str) -> InstrumentationScope:
    return InstrumentationScope(pb.name, pb.version or None, schema_url or None,
                                decode_attributes(pb.attributes) or None)


def _id(raw: bytes, size: int) -> int:
    if len(raw) != size:
        raise _Malformed(f"id of {len(raw)} bytes, expected {size}")
    value = int.from_bytes(raw, "big")
    if not value:
        raise _Malformed("all-zero id")
    return value


def _any_id(raw: bytes, size: int) -> int:
    """An id as an encoder wrote it (encoded_span): zero allowed, as the SDK writes a span's."""
    return int.from_bytes(raw, "big")


Ids = Callable[[bytes, int], int]


def _trace_state(text: str) -> TraceState | None:
    return TraceState.from_header([text]) if text else None


def _is_remote(flags: int) -> bool:
    return bool(flags & _HAS_REMOTE and flags & _IS_REMOTE)


# -- spans -----------------------------------------------------------------------------------
def _links(pb_span: Any, drops: Drops, ids: Ids = _id) -> list[Link]:
    links = []
    for pb in pb_span.links:
        try:
            ctx = SpanContext(ids(pb.trace_id, 16), ids(pb.span_id, 8), is_remote=_is_remote(pb.flags),
                              trace_flags=_SAMPLED, trace_state=_trace_state(pb.trace_state))
        except _Malformed:
            drops["malformed_link"] += 1
            continue
        links.append(Link(ctx, decode_attributes(pb.attributes)))
    return links


def _span(pb: Any, resource: Resource, scope: InstrumentationScope | None, drops: Drops,
          ids: Ids = _id) -> ReadableSpan:
    trace_id = ids(pb.trace_id, 16)
    context = SpanContext(trace_id, ids(pb.span_id, 8), is_remote=False, trace_flags=_SAMPLED,
                          trace_state=_trace_state(pb.trace_state))
    parent = None
    if pb.parent_span_id:
        parent = SpanContext(trace_id, ids(pb.parent_span_id, 8), is_remote=_is_remote(pb.flags),
                             trace_flags=_SAMPLED)
    code = _STATUS.get(pb.status.code, StatusCode.UNSET)
    status = Status(code, pb.status.message if code is StatusCode.ERROR and pb.status.message else None)
    events = [Event(e.name, decode_attributes(e.attributes), e.time_unix_nano) for e in pb.events]
    attributes, bad_links = decode_attributes(pb.attributes), drops["malformed_link"]
    span = ReadableSpan(
        pb.name, context=context, parent=parent, resource=resource, attributes=attributes,
        events=events or (), links=_links(pb, drops, ids) or (), kind=_KINDS.get(pb.kind, SpanKind.INTERNAL),
        status=status,
        start_time=pb.start_time_unix_nano, end_time=pb.end_time_unix_nano, instrumentation_scope=scope)
    if len(attributes) == len(pb.attributes) and drops["malformed_link"] == bad_links:
        span.__dict__[RECEIVED_SPAN] = pb.SerializeToString()  # no key twice, no link left out: the bytes say no more
    return span


def encoded_span(item: tuple[bytes, Resource, InstrumentationScope | None]) -> ReadableSpan:
    """The SDK span of a span encoded ahead (otlp_proto.encode_ahead: its Span message bytes, resource, scope), as
    it would be received; for an encoder's fallback, which needs the span's fields."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanMessage

    body, resource, scope = item
    drops: Drops = Counter()
    return _span(SpanMessage.FromString(body), resource, scope, drops, _any_id)


def _load_decoder() -> Any:
    try:
        from otel_ebpf.emit import _otlpdec  # type: ignore[attr-defined]
    except ImportError:  # the optional extension is not built (no C compiler)
        return None
    statuses = tuple(Status(code) for code in (StatusCode.UNSET, StatusCode.OK, StatusCode.ERROR))
    _otlpdec.setup(ReadableSpan, SpanContext, ReceivedResource, InstrumentationScope, Event, Link,
                   tuple(_KINDS[k] for k in range(6)), statuses, Status, StatusCode.ERROR, _SAMPLED,
                   DEFAULT_TRACE_STATE)
    return _otlpdec.decode_spans


_DECODE = _load_decoder()
NATIVE = _DECODE is not None  # whether spans are decoded in C


def decoder_cache_evictions() -> dict[str, int]:
    """Entries the C decoder's caches have dropped for room since the process started: {"otlp_resources": n,
    "otlp_scopes": n} (each cache is cleared whole when it reaches its bound, so a clear drops all it held); empty
    without the extension. One count for the process: a caller keeps its own baseline."""
    if _DECODE is None:
        return {}
    from otel_ebpf.emit import _otlpdec  # type: ignore[attr-defined]

    info = _otlpdec.cache_info()
    return {f"otlp_{name}": clears * bound for name, (_size, bound, clears) in info.items()}


def spans_from_request(request: ExportTraceServiceRequest, raw: bytes | None = None, *,
                       native: bool = True) -> tuple[list[ReadableSpan], Drops]:
    """Every convertible span of ``request`` (request order) and what was left out, by reason. ``raw``: the bytes
    ``request`` was parsed from, if the caller has them (the C decoder reads them instead of the request serialized
    again). ``native=False``: the C decoder already handed these bytes back (the gateway decodes before any parse),
    so the Python conversion only.

    Spans of one ``ResourceSpans`` share one ``Resource`` object, those of one ``ScopeSpans``
    one ``InstrumentationScope`` (and so do those of others of the same bytes)."""
    if _DECODE is not None and native:
        got = spans_from_bytes(request.SerializeToString() if raw is None else raw)
        if got is not None:
            return got
    return _spans_in_python(request)


def spans_from_bytes(raw: bytes) -> tuple[list[ReadableSpan], Drops] | None:
    """:func:`spans_from_request` of the request these protobuf bytes hold, decoded in C without parsing them; None
    for bytes the C decoder does not decode (a request off its fast path, bytes that do not parse, no extension):
    parse them, then :func:`spans_from_request`. What it decodes, the parse would have accepted: every string it
    meets is checked to be UTF-8, what it does not read is skipped by its wire type, and anything else it hands
    back."""
    if _DECODE is None:
        return None
    got = _DECODE(raw)
    if got is None:
        return None
    spans, malformed_spans, malformed_links = got
    drops: Drops = Counter()
    if malformed_spans:
        drops["malformed_span"] = malformed_spans
    if malformed_links:
        drops["malformed_link"] = malformed_links
    return spans, drops


def _spans_in_python(request: ExportTraceServiceRequest) -> tuple[list[ReadableSpan], Drops]:
    """:func:`spans_from_request` in Python, from the parsed request. Resources (and scopes) of the same bytes share
    one object, as the C decoder's do (it keeps them across requests too)."""
    spans: list[ReadableSpan] = []
    drops: Drops = Counter()
    made: dict[tuple[str, bytes, str], Any] = {}
    for rs in request.resource_spans:
        key = ("resource", rs.resource.SerializeToString(), rs.schema_url)
        if (resource := made.get(key)) is None:
            resource = made[key] = _resource(rs.resource, rs.schema_url)
        for ss in rs.scope_spans:
            key = ("scope", ss.scope.SerializeToString(), ss.schema_url)
            if (scope := made.get(key)) is None:
                scope = made[key] = _scope(ss.scope, ss.schema_url)
            for pb in ss.spans:
                try:
                    spans.append(_span(pb, resource, scope, drops))
                except (_Malformed, ValueError, TypeError):
                    drops["malformed_span"] += 1
    return spans, drops


# -- metrics ---------------------------------------------------------------------------------
def _exemplars(pb_point: Any) -> list[Exemplar]:
    out = []
    for ex in pb_point.exemplars:
        kind = ex.WhichOneof("value")
        value = getattr(ex, kind) if kind else 0
        span_id = int.from_bytes(ex.span_id, "big") if len(ex.span_id) == 8 else None
        trace_id = int.from_bytes(ex.trace_id, "big") if len(ex.trace_id) == 16 else None
        out.append(Exemplar(decode_attributes(ex.filtered_attributes), value, ex.time_unix_nano,
                            span_id if trace_id else None, trace_id if span_id else None))
    return out


def _number_points(points: Any) -> list[NumberDataPoint]:
    out = []
    for p in points:
        kind = p.WhichOneof("value")
        if kind is None:
            raise _Malformed("number data point without a value")
        out.append(NumberDataPoint(decode_attributes(p.attributes), p.start_time_unix_nano, p.time_unix_nano,
                                   getattr(p, kind), _exemplars(p)))
    return out


def _histogram_points(points: Any) -> list[HistogramDataPoint]:
    out = []
    for p in points:
        counts, bounds = list(p.bucket_counts), list(p.explicit_bounds)
        if counts and len(counts) != len(bounds) + 1:
            raise _Malformed("histogram bucket_counts must be one longer than explicit_bounds")
        out.append(HistogramDataPoint(
            decode_attributes(p.attributes), p.start_time_unix_nano, p.time_unix_nano, p.count,
            p.sum if p.HasField("sum") else 0.0, counts, bounds,
            p.min if p.HasField("min") else None, p.max if p.HasField("max") else None,  # type: ignore[arg-type]
            _exemplars(p)))
    return out


def _temporality(value: int) -> AggregationTemporality:
    try:
        return _TEMPORALITY[value]
    except KeyError:
        raise _Malformed(f"aggregation temporality {value}") from None


def _metric(pb: Any) -> Metric | None:
    """The SDK metric, None for an unsupported point type; raises _Malformed."""
    kind = pb.WhichOneof("data")
    data: Sum | Gauge | Histogram
    if kind == "sum":
        data = Sum(_number_points(pb.sum.data_points), _temporality(pb.sum.aggregation_temporality),
                   pb.sum.is_monotonic)
    elif kind == "gauge":
        data = Gauge(_number_points(pb.gauge.data_points))
    elif kind == "histogram":
        data = Histogram(_histogram_points(pb.histogram.data_points),
                         _temporality(pb.histogram.aggregation_temporality))
    else:
        return None
    return Metric(pb.name, pb.description, pb.unit, data)


def _points(pb: Any) -> int:
    kind = pb.WhichOneof("data")
    return max(1, len(getattr(pb, kind).data_points)) if kind else 1


def metrics_from_request(request: ExportMetricsServiceRequest) -> tuple[MetricsData, Drops]:
    """Sum, Gauge and Histogram metrics of ``request`` as one MetricsData, and the data points
    left out by reason (a metric with no points counts as one)."""
    drops: Drops = Counter()
    by_resource: dict[Resource, dict[InstrumentationScope, list[Metric]]] = {}
    for rm in request.resource_metrics:
        scopes = by_resource.setdefault(_resource(rm.resource, rm.schema_url), {})
        for sm in rm.scope_metrics:
            metrics = scopes.setdefault(_scope(sm.scope, sm.schema_url), [])
            for pb in sm.metrics:
                try:
                    metric = _metric(pb)
                except (_Malformed, ValueError, TypeError):
                    drops["malformed_metric"] += _points(pb)
                    continue
                if metric is None:
                    drops["unsupported_metric_type"] += _points(pb)
                else:
                    metrics.append(metric)
    out = [ResourceMetrics(resource, [ScopeMetrics(scope, metrics, scope.schema_url or "")
                                      for scope, metrics in scopes.items() if metrics], resource.schema_url)
           for resource, scopes in by_resource.items()]
    return MetricsData([rm for rm in out if rm.scope_metrics]), drops


# -- logs ------------------------------------------------------------------------------------
def _optional_id(raw: bytes, size: int) -> int:
    """A log record's id: empty or all-zero is none (0); another length raises _Malformed."""
    if raw and len(raw) != size:
        raise _Malformed(f"id of {len(raw)} bytes, expected {size}")
    return int.from_bytes(raw, "big") if raw else 0


def _log(pb: Any, resource: Resource, scope: InstrumentationScope) -> ReadableLogRecord:
    trace_id, span_id = _optional_id(pb.trace_id, 16), _optional_id(pb.span_id, 8)
    context = log_context(trace_id, span_id, TraceFlags(pb.flags & 0xFF))
    record = SdkLogRecord(
        timestamp=pb.time_unix_nano or None, observed_timestamp=pb.observed_time_unix_nano or None,
        context=context, severity_text=pb.severity_text or None,
        severity_number=_SEVERITY.get(pb.severity_number, SeverityNumber.UNSPECIFIED),
        body=_value(pb.body) if pb.HasField("body") else None, attributes=decode_attributes(pb.attributes),
        event_name=pb.event_name or None)
    return ReadableLogRecord(record, resource, scope)


def logs_from_request(request: ExportLogsServiceRequest) -> tuple[list[ReadableLogRecord], Drops]:
    """Every convertible log record of ``request`` (request order) and what was left out, by
    reason. Records of one ``ResourceLogs`` share one ``Resource`` object, those of one
    ``ScopeLogs`` one ``InstrumentationScope``. A record without ``observed_time_unix_nano``
    gets the time of decoding (the SDK's default), one without ``time_unix_nano`` none."""
    logs: list[ReadableLogRecord] = []
    drops: Drops = Counter()
    for rl in request.resource_logs:
        resource = _resource(rl.resource, rl.schema_url)
        for sl in rl.scope_logs:
            scope = _scope(sl.scope, sl.schema_url)
            for pb in sl.log_records:
                try:
                    logs.append(_log(pb, resource, scope))
                except (_Malformed, ValueError, TypeError):
                    drops["malformed_log"] += 1
    return logs, drops
