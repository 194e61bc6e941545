"""Read OTLP JSON lines files (the file exporter's ``traces.jsonl`` / ``metrics.jsonl`` /
``logs.jsonl``) into flat rows.

The files hold one ``Export*ServiceRequest`` per line in the OTLP/JSON encoding: hex ids,
lowerCamelCase keys, 64-bit integers as strings, attribute values as ``{"stringValue": ...}``.
:func:`read_otlp_json` turns them into :class:`SpanRow`, :class:`MetricPoint` and
:class:`LogRow` rows with plain Python attribute values (arrays as tuples), ready for the HTML
report, the Perfetto export and Parquet (which read spans and metrics only, so far). A line that
is not valid OTLP/JSON is skipped and counted in ``OtlpData.bad_lines`` (never raised); a
missing file reads as empty. Pure functions, no OTel SDK.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FILES", "LogRow", "MetricPoint", "OtlpData", "SpanEvent", "SpanRow", "decode_attributes",
           "read_otlp_json"]

FILES = ("traces.jsonl", "metrics.jsonl", "logs.jsonl")  # what a directory is read for (otel_ebpf/emit/jsonfile.py)

_STATUS = {0: "unset", 1: "ok", 2: "error", "STATUS_CODE_UNSET": "unset", "STATUS_CODE_OK": "ok",
           "STATUS_CODE_ERROR": "error"}
_KIND = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(v: dict[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "arrayValue" in v:
        return tuple(_value(x) for x in v["arrayValue"].get("values", []))
    if "kvlistValue" in v:
        return decode_attributes(v["kvlistValue"].get("values", []))
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


def decode_attributes(kvs: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP/JSON ``[{"key": k, "value": {...}}]`` -> ``{k: python value}`` (arrays as tuples)."""
    return {kv["key"]: _value(kv.get("value", {})) for kv in kvs}


@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(frozen=True)
class SpanRow:
    """One span. Times are Unix epoch ns; ids are lowercase hex ('' when absent)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    status: str  # unset | ok | error
    status_message: str
    scope: str
    resource: dict[str, Any]
    attributes: dict[str, Any]
    events: tuple[SpanEvent, ...] = ()

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    def get(self, key: str, default: Any = None) -> Any:
        """A span attribute, else the resource attribute of that name."""
        if key in self.attributes:
            return self.attributes[key]
        return self.resource.get(key, default)


@dataclass(frozen=True)
class MetricPoint:
    """One data point. ``kind``: sum | gauge | histogram | exponential_histogram | summary.
    ``value`` is the number for sum/gauge, else None; histograms fill ``count``/``sum``
    (and ``bounds``/``bucket_counts`` for explicit buckets). ``temporality``: delta,
    cumulative or '' (gauges)."""

    name: str
    unit: str
    description: str
    kind: str
    temporality: str
    monotonic: bool
    start_ns: int
    time_ns: int
    value: float | None
    count: int | None
    sum: float | None
    min: float | None
    max: float | None
    bounds: tuple[float, ...]
    bucket_counts: tuple[int, ...]
    scope: str
    resource: dict[str, Any]
    attributes: dict[str, Any]


@dataclass(frozen=True)
class LogRow:
    """One log record. Times are Unix epoch ns (0: absent); ids lowercase hex ('' when absent);
    ``body`` a plain Python value (a captured stack is a string)."""

    time_ns: int
    observed_ns: int
    severity_text: str
    severity_number: int
    event_name: str
    body: Any
    trace_id: str
    span_id: str
    scope: str
    resource: dict[str, Any]
    attributes: dict[str, Any]


@dataclass
class OtlpData:
    spans: list[SpanRow] = field(default_factory=list)
    metrics: list[MetricPoint] = field(default_factory=list)
    logs: list[LogRow] = field(default_factory=list)
    bad_lines: int = 0
    files: list[str] = field(default_factory=list)


def _spans(line: dict[str, Any]) -> Iterator[SpanRow]:
    for rs in line.get("resourceSpans", []):
        resource = decode_attributes(rs.get("resource", {}).get("attributes", []))
        for ss in rs.get("scopeSpans", []):
            scope = ss.get("scope", {}).get("name", "")
            for s in ss.get("spans", []):
                status = s.get("status", {})
                yield SpanRow(
                    trace_id=s.get("traceId", ""), span_id=s.get("spanId", ""),
                    parent_span_id=s.get("parentSpanId", ""), name=s.get("name", ""),
                    kind=_KIND.get(s.get("kind", 0), str(s.get("kind", ""))).lower(),
                    start_ns=int(s.get("startTimeUnixNano", 0)), end_ns=int(s.get("endTimeUnixNano", 0)),
                    status=_STATUS.get(status.get("code", 0), "unset"), status_message=status.get("message", ""),
                    scope=scope, resource=resource, attributes=decode_attributes(s.get("attributes", [])),
                    events=tuple(SpanEvent(e.get("name", ""), int(e.get("timeUnixNano", 0)),
                                           decode_attributes(e.get("attributes", [])))
                                 for e in s.get("events", [])))


_TEMPORALITY = {1: "delta", 2: "cumulative", "AGGREGATION_TEMPORALITY_DELTA": "delta",
                "AGGREGATION_TEMPORALITY_CUMULATIVE": "cumulative"}


def _number(p: dict[str, Any]) -> float | None:
    if "asDouble" in p:
        return float(p["asDouble"])
    if "asInt" in p:
        return float(int(p["asInt"]))
    return None


def _opt(p: dict[str, Any], key: str) -> float | None:
    return float(p[key]) if key in p else None


def _points(metric: dict[str, Any], resource: dict[str, Any], scope: str) -> Iterator[MetricPoint]:
    name, unit, desc = metric.get("name", ""), metric.get("unit", ""), metric.get("description", "")
    for kind in ("sum", "gauge", "histogram", "exponentialHistogram", "summary"):
        if kind in metric:
            break
    else:
        return
    body = metric[kind]
    temporality = _TEMPORALITY.get(body.get("aggregationTemporality", 0), "")
    for p in body.get("dataPoints", []):
        hist = kind != "sum" and kind != "gauge"
        yield MetricPoint(
            name=name, unit=unit, description=desc,
            kind="exponential_histogram" if kind == "exponentialHistogram" else kind,
            temporality=temporality, monotonic=bool(body.get("isMonotonic", False)),
            start_ns=int(p.get("startTimeUnixNano", 0)), time_ns=int(p.get("timeUnixNano", 0)),
            value=None if hist else _number(p), count=int(p["count"]) if hist and "count" in p else None,
            sum=_opt(p, "sum"), min=_opt(p, "min"), max=_opt(p, "max"),
            bounds=tuple(float(b) for b in p.get("explicitBounds", [])),
            bucket_counts=tuple(int(c) for c in p.get("bucketCounts", [])),
            scope=scope, resource=resource, attributes=decode_attributes(p.get("attributes", [])))


def _metrics(line: dict[str, Any]) -> Iterator[MetricPoint]:
    for rm in line.get("resourceMetrics", []):
        resource = decode_attributes(rm.get("resource", {}).get("attributes", []))
        for sm in rm.get("scopeMetrics", []):
            scope = sm.get("scope", {}).get("name", "")
            for m in sm.get("metrics", []):
                yield from _points(m, resource, scope)


# OTLP/JSON may spell enums by name: SEVERITY_NUMBER_TRACE = 1, ..._TRACE2 = 2, ..., ..._FATAL4 = 24
_SEVERITY = {"SEVERITY_NUMBER_UNSPECIFIED": 0} | {
    f"SEVERITY_NUMBER_{name}{suffix}": 1 + 4 * i + j for i, name in enumerate(("TRACE", "DEBUG", "INFO", "WARN",
                                                                                  "ERROR", "FATAL"))
    for j, suffix in enumerate(("", "2", "3", "4"))}


def _logs(line: dict[str, Any]) -> Iterator[LogRow]:
    for rl in line.get("resourceLogs", []):
        resource = decode_attributes(rl.get("resource", {}).get("attributes", []))
        for sl in rl.get("scopeLogs", []):
            scope = sl.get("scope", {}).get("name", "")
            for r in sl.get("logRecords", []):
                severity = r.get("severityNumber", 0)
                yield LogRow(
                    time_ns=int(r.get("timeUnixNano", 0)), observed_ns=int(r.get("observedTimeUnixNano", 0)),
                    severity_text=r.get("severityText", ""),
                    severity_number=_SEVERITY.get(severity, 0) if isinstance(severity, str) else int(severity),
                    event_name=r.get("eventName", ""), body=_value(r.get("body", {})),
                    trace_id=r.get("traceId", ""), span_id=r.get("spanId", ""), scope=scope, resource=resource,
                    attributes=decode_attributes(r.get("attributes", [])))


def _read_lines(path: Path, data: OtlpData) -> None:
    try:
        fh = open(path, encoding="utf-8")
    except OSError:
        return
    data.files.append(str(path))
    with fh:
        for raw in fh:
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
                if not isinstance(line, dict):
                    raise ValueError("not an object")
                spans, metrics, logs = list(_spans(line)), list(_metrics(line)), list(_logs(line))  # all, or none
            except (ValueError, TypeError, AttributeError, KeyError):
                data.bad_lines += 1
                continue
            data.spans.extend(spans)
            data.metrics.extend(metrics)
            data.logs.extend(logs)


def read_otlp_json(source: str | os.PathLike[str]) -> OtlpData:
    """Read a directory's :data:`FILES` (any may be missing), or one ``.jsonl`` file. Raises
    FileNotFoundError when ``source`` does not exist at all."""
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"no OTLP JSON lines at {path} (expected a directory with traces.jsonl "
                                "and/or metrics.jsonl, or a .jsonl file)")
    data = OtlpData()
    for f in ([path / name for name in FILES] if path.is_dir() else [path]):
        _read_lines(f, data)
    data.spans.sort(key=lambda s: (s.start_ns, s.end_ns))
    data.metrics.sort(key=lambda m: m.time_ns)
    data.logs.sort(key=lambda r: r.time_ns or r.observed_ns)
    return data
