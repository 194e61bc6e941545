"""The report's metric charts, grouped in sections named for what they hold.

Sections (in page order): GPU / CUDA / NCCL; PyTorch; process (per traced process); host
(system-wide); other. The agent's own ``otel_ebpf.*`` counters are not charted (the header
shows its drops). Each chart is one metric, its series one per process or rank and attribute
set (the ``MAX_SERIES`` largest), each thinned to ``MAX_POINTS`` points.

What a chart's values are, by instrument: a monotonic cumulative sum is a cumulative total; an
up-down counter (a non-monotonic sum, such as RSS) or a gauge is the current value; a histogram
is charted as the sum of its observations. An up-down counter of a process returns to 0 when
the process exits (processors/memory): readings taken after its process-lifetime span ended are
left out, and the chart says so. A metric whose series are each read at fewer than
:data:`MIN_READINGS` distinct times is not drawn as a line (one reading would run from one instant
to the same instant, two make a straight line): the page lists its values instead
(``"values": true``).

Times are microseconds from ``t0`` (the first span; metrics read before it are negative).
Pure functions; no I/O.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from otel_ebpf.report.otlpfiles import MetricPoint

__all__ = ["MAX_CHARTS", "MAX_POINTS", "MAX_SERIES", "MIN_READINGS", "SECTIONS", "charts", "section_of"]

MAX_CHARTS, MAX_SERIES, MAX_POINTS = 30, 8, 400
MIN_READINGS = 3
# (title, metric name prefixes); the first section whose prefix matches holds the metric
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GPU / CUDA / NCCL metrics", ("gpu.", "hw.", "nccl.", "cuda.")),
    ("PyTorch metrics", ("pytorch.", "torch.")),
    ("Process metrics (per traced process)", ("process.",)),
    ("Host metrics (system-wide)", ("system.",)),
    ("Other metrics", ("",)),
)
# chart order inside the GPU section: memory copies, synchronisation, kernels first
_GPU_FIRST = ("gpu.cuda.memory", "gpu.cuda.synchronize", "gpu.cuda.kernel")
_SELF = "otel_ebpf."


def section_of(name: str) -> int:
    """The index in :data:`SECTIONS` of the section a metric is shown in."""
    return next(i for i, (_, prefixes) in enumerate(SECTIONS) if name.startswith(prefixes))


def _order(name: str) -> tuple[int, int, str]:
    first = next((i for i, p in enumerate(_GPU_FIRST) if name.startswith(p)), len(_GPU_FIRST))
    return section_of(name), first, name


def _series_key(p: MetricPoint) -> str:
    parts = [str(p.resource[k]) for k in ("host.name",) if k in p.resource]
    if "ml.rank" in p.resource:
        parts.append(f"rank {p.resource['ml.rank']}")
    elif "process.pid" in p.resource:
        exe = p.resource.get("process.executable.name")
        parts.append(f"{exe} {p.resource['process.pid']}" if exe else f"pid {p.resource['process.pid']}")
    parts += [f"{k}={v}" for k, v in sorted(p.attributes.items()) if k != "host.name"]
    return " ".join(parts) or str(p.resource.get("service.name", "-"))


def _value(p: MetricPoint) -> float | None:
    return p.value if p.kind in ("sum", "gauge") else p.sum


def _what(p: MetricPoint) -> str:
    if p.kind == "gauge":
        return "current value"
    if p.kind == "sum" and not p.monotonic:
        return "current value" if p.temporality != "delta" else "change per interval"
    if p.kind == "sum":
        return "cumulative total" if p.temporality != "delta" else "per interval"
    if p.kind == "histogram":
        return "sum of observations" + (" (cumulative)" if p.temporality == "cumulative" else " per interval")
    return p.kind.replace("_", " ")


def _after_exit(p: MetricPoint, exits: Mapping[tuple[str, int], int]) -> bool:
    """An up-down counter's reading taken after its process exited (it reads 0 then: state returned)."""
    if p.kind != "sum" or p.monotonic:
        return False
    pid = p.resource.get("process.pid")
    end = exits.get((str(p.resource.get("host.name", "?")), pid)) if isinstance(pid, int) else None
    return end is not None and p.time_ns > end


def _chart(name: str, pts: list[MetricPoint], t0: int, exits: Mapping[tuple[str, int], int]) -> dict[str, Any]:
    series: dict[str, list[list[float]]] = defaultdict(list)
    left_out = 0
    for p in pts:
        if _after_exit(p, exits):
            left_out += 1
            continue
        v = _value(p)
        assert v is not None
        series[_series_key(p)].append([round((p.time_ns - t0) / 1e3, 3), v])
    top = sorted(series.items(), key=lambda kv: -abs(kv[1][-1][1]))[:MAX_SERIES]
    p0 = pts[0]
    readings = max((len({pt[0] for pt in v}) for _, v in top), default=0)  # distinct times, most read series
    note = (f"{left_out} reading{'s' if left_out > 1 else ''} after the process exited (back to 0 then) left out"
            if left_out else "")
    return {"name": name, "unit": p0.unit, "kind": p0.kind, "what": _what(p0), "description": p0.description,
            "section": section_of(name), "readings": readings, "values": readings < MIN_READINGS, "note": note,
            "series": [{"label": k, "points": v[:: max(1, len(v) // MAX_POINTS)][:MAX_POINTS]} for k, v in top],
            "series_total": len(series)}


def charts(points: list[MetricPoint], t0: int, exits: Mapping[tuple[str, int], int]) -> list[dict[str, Any]]:
    """The charts, in section order. ``exits``: {(host, pid): end ns of its process-lifetime span}."""
    by_name: dict[str, list[MetricPoint]] = defaultdict(list)
    for p in points:
        if not p.name.startswith(_SELF) and _value(p) is not None:
            by_name[p.name].append(p)
    out = [_chart(name, by_name[name], t0, exits) for name in sorted(by_name, key=_order)[:MAX_CHARTS]]
    return [c for c in out if c["series"]]
