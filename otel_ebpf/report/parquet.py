"""Parquet export for offline analysis (polars, pandas, DuckDB): spans, metric points, typed events.

* :func:`write_otlp_parquet` - OTLP JSON lines (a ``--output`` directory) -> ``spans.parquet`` and
  ``metrics.parquet``; the schema is documented in docs/analysis.md and is :data:`SPAN_SCHEMA`
  / :data:`METRIC_SCHEMA` here. Common attributes are promoted to columns (span attribute
  first, then resource attribute); all attributes stay available as a JSON string column.
* :func:`write_events` - the Python API's typed events (receivers' frozen dataclasses,
  SpanRecord, MetricRecord...) -> one ``<TypeName>.parquet`` per type, one column per field.

Needs pyarrow (``pip install 'otel-ebpf[analysis]'``); without it the functions raise
OtelEbpfError saying so. Blocking file I/O; files are written to a temporary name and renamed.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from otel_ebpf.core.errors import OtelEbpfError
from otel_ebpf.report.model import is_collective_root
from otel_ebpf.report.otlpfiles import MetricPoint, SpanRow, read_otlp_json

__all__ = ["METRIC_COLUMNS", "PROMOTED", "SPAN_COLUMNS", "events_table", "metrics_table", "spans_table",
           "write_events", "write_otlp_parquet"]

# column -> the attribute keys it is promoted from (first found wins; span attributes before resource)
PROMOTED: dict[str, tuple[str, ...]] = {
    "service": ("service.name",),
    "host": ("host.name",),
    "pid": ("process.pid",),
    "process": ("process.executable.name",),
    "rank": ("ml.rank", "nccl.rank"),
    "thread_id": ("thread.id",),
    "container_id": ("container.id",),
    "pod": ("k8s.pod.name",),
    "pod_uid": ("k8s.pod.uid",),
    "hw_id": ("hw.id",),
}
_INT_PROMOTED = {"pid", "rank", "thread_id"}
_INT64_MAX = 2**63 - 1


def _pa() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise OtelEbpfError("Parquet export needs pyarrow, which is not installed for this Python",
                            hint="pip install 'otel-ebpf[analysis]' (or pyarrow)") from None
    return pyarrow


def _schema(pa: Any, head: list[tuple[str, Any]], tail: list[tuple[str, Any]]) -> Any:
    promoted = [(c, pa.int64() if c in _INT_PROMOTED else pa.string()) for c in PROMOTED]
    return pa.schema(head + promoted + tail)


def _span_fields(pa: Any) -> Any:
    return _schema(pa, [("trace_id", pa.string()), ("span_id", pa.string()), ("parent_span_id", pa.string()),
                        ("name", pa.string()), ("kind", pa.string()), ("scope", pa.string()),
                        ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("duration_ns", pa.int64()),
                        ("status", pa.string()), ("status_message", pa.string())],
                   [("attributes", pa.string()), ("resource", pa.string()), ("events", pa.string())])


def _metric_fields(pa: Any) -> Any:
    return _schema(pa, [("name", pa.string()), ("unit", pa.string()), ("kind", pa.string()),
                        ("temporality", pa.string()), ("monotonic", pa.bool_()), ("start_ns", pa.int64()),
                        ("time_ns", pa.int64()), ("value", pa.float64()), ("count", pa.int64()),
                        ("sum", pa.float64()), ("min", pa.float64()), ("max", pa.float64()),
                        ("bounds", pa.list_(pa.float64())), ("bucket_counts", pa.list_(pa.int64())),
                        ("scope", pa.string())],
                   [("attributes", pa.string()), ("resource", pa.string())])


SPAN_COLUMNS = ("trace_id", "span_id", "parent_span_id", "name", "kind", "scope", "start_ns", "end_ns",
                "duration_ns", "status", "status_message", *PROMOTED, "attributes", "resource", "events")
METRIC_COLUMNS = ("name", "unit", "kind", "temporality", "monotonic", "start_ns", "time_ns", "value", "count",
                  "sum", "min", "max", "bounds", "bucket_counts", "scope", *PROMOTED, "attributes", "resource")


def _jsonable(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    return v


def _dumps(v: Any) -> str:
    return json.dumps(_jsonable(v), separators=(",", ":"), default=str)


def _promote(attrs: Mapping[str, Any], resource: Mapping[str, Any], *, root: bool = False) -> dict[str, Any]:
    """The promoted columns. ``root``: a collective joined across ranks, which has no rank of its
    own (its resource is one of the ranks' processes, or the gateway's)."""
    out: dict[str, Any] = {}
    for col, keys in PROMOTED.items():
        value = next((src[k] for src in (attrs, resource) for k in keys if k in src), None)
        if root and col == "rank":
            value = None
        if col in _INT_PROMOTED and value is not None:
            try:
                value = int(value)
            except (TypeError, ValueError):
                value = None
        elif value is not None:
            value = str(value)
        out[col] = value
    return out


def spans_table(spans: Iterable[SpanRow]) -> Any:
    """A ``pyarrow.Table`` with :data:`SPAN_COLUMNS`."""
    pa = _pa()
    rows = [{"trace_id": s.trace_id, "span_id": s.span_id, "parent_span_id": s.parent_span_id or None,
             "name": s.name, "kind": s.kind, "scope": s.scope, "start_ns": s.start_ns, "end_ns": s.end_ns,
             "duration_ns": s.duration_ns, "status": s.status, "status_message": s.status_message,
             **_promote(s.attributes, s.resource, root=is_collective_root(s)), "attributes": _dumps(s.attributes),
             "resource": _dumps(s.resource), "events": _dumps(s.events)} for s in spans]
    return pa.Table.from_pylist(rows, schema=_span_fields(pa))


def metrics_table(points: Iterable[MetricPoint]) -> Any:
    """A ``pyarrow.Table`` with :data:`METRIC_COLUMNS`, one row per data point."""
    pa = _pa()
    rows = [{"name": p.name, "unit": p.unit, "kind": p.kind, "temporality": p.temporality, "monotonic": p.monotonic,
             "start_ns": p.start_ns, "time_ns": p.time_ns, "value": p.value, "count": p.count, "sum": p.sum,
             "min": p.min, "max": p.max, "bounds": list(p.bounds), "bucket_counts": list(p.bucket_counts),
             "scope": p.scope, **_promote(p.attributes, p.resource), "attributes": _dumps(p.attributes),
             "resource": _dumps(p.resource)} for p in points]
    return pa.Table.from_pylist(rows, schema=_metric_fields(pa))


def _write(table: Any, path: Path) -> Path:
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(path)
    return path


def write_otlp_parquet(source: str | os.PathLike[str], outdir: str | os.PathLike[str]) -> dict[str, Path]:
    """OTLP JSON lines under ``source`` -> ``outdir/spans.parquet`` and ``outdir/metrics.parquet``.
    Returns {"spans": path, "metrics": path}. Raises FileNotFoundError for a missing source."""
    data = read_otlp_json(source)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    return {"spans": _write(spans_table(data.spans), out / "spans.parquet"),
            "metrics": _write(metrics_table(data.metrics), out / "metrics.parquet")}


_ID_HEX = {"trace_id": 32, "span_id": 16, "parent_span_id": 16}


def _cell(name: str, v: Any) -> Any:
    if name in _ID_HEX and isinstance(v, int):
        return format(v, f"0{_ID_HEX[name]}x")
    if isinstance(v, tuple) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return list(v)
    if isinstance(v, (tuple, Mapping)) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
        return _dumps(v)
    return v


def events_table(events: Iterable[object]) -> Any:
    """One ``pyarrow.Table`` for events of ONE dataclass type: a column per field. Mappings,
    tuples of non-numbers and nested records become JSON strings; trace/span ids hex strings;
    an int column with a value beyond int64 becomes decimal strings."""
    pa = _pa()
    rows = [{f.name: _cell(f.name, getattr(e, f.name)) for f in dataclasses.fields(e)}  # type: ignore[arg-type]
            for e in events]
    if rows:
        for col in rows[0]:
            if any(isinstance(r[col], int) and not -_INT64_MAX - 1 <= r[col] <= _INT64_MAX for r in rows):
                for r in rows:
                    r[col] = None if r[col] is None else str(r[col])
    return pa.Table.from_pylist(rows)


def write_events(events: Iterable[object], outdir: str | os.PathLike[str]) -> dict[str, Path]:
    """Typed events -> ``outdir/<TypeName>.parquet``, one file per dataclass type; objects that are
    not dataclass instances are not written. Returns {type name: path}."""
    by_type: dict[str, list[object]] = defaultdict(list)
    for e in events:
        if dataclasses.is_dataclass(e) and not isinstance(e, type):
            by_type[type(e).__name__].append(e)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    return {name: _write(events_table(rows), out / f"{name}.parquet") for name, rows in sorted(by_type.items())}
