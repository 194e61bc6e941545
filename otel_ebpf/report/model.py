"""What the HTML report shows, computed from OTLP rows: lanes, collectives, charts, tables, header.

:func:`build` returns plain JSON-ready data (the page embeds it and draws it with its own JS).
Times in the data are microseconds from the earliest span or point (``meta.t0_ns``), so the
numbers stay small. Everything is bounded: at most ``max_spans`` spans on the timeline
(collective spans of ranks first, then the slowest others; the page says how many were left
out), ``MAX_CHARTS`` charts of ``MAX_SERIES`` series of ``MAX_POINTS`` points, ``top`` rows
per table. Pure function; no I/O.
"""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from otel_ebpf.host.timeline import straggler_figures, why_late
from otel_ebpf.report.otlpfiles import LogRow, MetricPoint, OtlpData, SpanRow

__all__ = ["DEFAULT_MAX_SPANS", "MAX_CHARTS", "MAX_POINTS", "MAX_SERIES", "build", "is_collective_root",
           "lane_key"]

DEFAULT_MAX_SPANS = 20_000
MAX_CHARTS, MAX_SERIES, MAX_POINTS = 12, 8, 400
_ATTR_CHARS = 200  # longest attribute value shown on hover
# Chart order: GPU/CUDA first, then NCCL, then NVML hardware metrics, then anything else;
# the agent's own counters are in the header (drops), not charted.
_CHART_PREFIXES = ("gpu.cuda.memory", "gpu.cuda.synchronize", "gpu.cuda.kernel", "gpu.", "hw.gpu", "hw.",
                   "nccl.collective", "nccl.", "")
DROPPED = "otel_ebpf.events.dropped"


def is_collective_root(s: SpanRow) -> bool:
    """A collective joined across ranks by the gateway (no rank of its own, no parent)."""
    a = s.attributes
    return "nccl.ranks.arrived" in a and "nccl.seq" in a and "nccl.rank" not in a and not s.parent_span_id


def _rank(s: SpanRow) -> int | None:
    r = s.attributes.get("nccl.rank", s.resource.get("ml.rank"))
    try:
        return None if r is None else int(r)
    except (TypeError, ValueError):
        return None


def lane_key(s: SpanRow) -> tuple[str, int, int]:
    """(host, rank or -1, pid or 0 when ranked): one timeline lane per rank, else per process."""
    host = str(s.resource.get("host.name", "?"))
    rank = _rank(s)
    if rank is not None:
        return host, rank, 0
    pid = s.resource.get("process.pid", 0)
    return host, -1, int(pid) if isinstance(pid, int) else 0


def _short(v: Any) -> Any:
    if isinstance(v, str) and len(v) > _ATTR_CHARS:
        return v[:_ATTR_CHARS] + "..."
    if isinstance(v, tuple):
        return [_short(x) for x in v[:32]]
    return v


def _process(s: SpanRow) -> str:
    exe = s.resource.get("process.executable.name") or s.resource.get("service.name") or "?"
    return f"{exe} ({s.resource.get('process.pid', '?')})"


def _collective(s: SpanRow, t0: int) -> dict[str, Any]:
    a = s.attributes
    return {"op": str(a.get("nccl.op", s.name)), "seq": a.get("nccl.seq"), "comm": a.get("nccl.comm.id", ""),
            "start": (s.start_ns - t0) / 1e3, "dur": s.duration_ns / 1e3,
            "skew_ms": a["nccl.skew_ns"] / 1e6 if isinstance(a.get("nccl.skew_ns"), int) else None,
            "straggler_rank": a.get("nccl.straggler.rank"), "straggler_host": a.get("nccl.straggler.host"),
            "arrived": a.get("nccl.ranks.arrived"), "nranks": a.get("nccl.nranks"),
            "partial": bool(a.get("nccl.partial")), "missing": list(a.get("nccl.missing_ranks", ())),
            "desyncs": [{"t": (e.time_ns - t0) / 1e3, "missing": list(e.attributes.get("nccl.missing_ranks", ())),
                         "waited_ms": e.attributes.get("nccl.waited_ns", 0) / 1e6,
                         "where": [f"rank {r}: {f}" for r, f in zip(e.attributes.get("nccl.missing.stack_ranks", ()),
                                                                    e.attributes.get("nccl.missing.functions", ()),
                                                                    strict=False)]}
                        for e in s.events if e.name == "nccl.desync"],
            "attrs": {k: _short(v) for k, v in a.items()}}


def _keep(spans: list[SpanRow], cap: int) -> tuple[list[SpanRow], str]:
    """At most ``cap`` spans: per-rank collective spans first, then the slowest others."""
    if len(spans) <= cap:
        return spans, "all spans shown"
    first = [s for s in spans if "nccl.seq" in s.attributes]
    rest = sorted((s for s in spans if "nccl.seq" not in s.attributes), key=lambda s: -s.duration_ns)
    kept = (first[-cap:] if len(first) >= cap else first + rest[:cap - len(first)])
    kept.sort(key=lambda s: s.start_ns)
    return kept, (f"{len(kept)} of {len(spans)} spans shown: collective spans first (newest), "
                  "then the slowest of the rest")


def _timeline(spans: list[SpanRow], roots: list[dict[str, Any]], t0: int, cap: int
              ) -> tuple[list[dict[str, Any]], list[list[Any]], str]:
    stragglers = {(c["comm"], c["seq"]): c["straggler_rank"] for c in roots if not c["partial"]}
    counts = Counter(c["straggler_rank"] for c in roots if not c["partial"] and c["straggler_rank"] is not None)
    worst = counts.most_common(1)[0][0] if counts else None
    kept, note = _keep(spans, cap)
    lanes: dict[tuple[str, int, int], int] = {}
    for key in sorted({lane_key(s) for s in kept}, key=lambda k: (k[1] < 0, k[1], k[0], k[2])):
        lanes[key] = len(lanes)
    out = []
    for s in kept:
        key = lane_key(s)
        a = s.attributes
        flag = 0
        if "nccl.seq" in a and stragglers.get((a.get("nccl.comm.id"), a.get("nccl.seq"))) == key[1] >= 0:
            flag = 1  # the straggler's own span of that collective
        row = 0 if s.scope.endswith("nccl") or s.name.startswith("nccl") else 1
        out.append([lanes[key], row, round((s.start_ns - t0) / 1e3, 3), round(s.duration_ns / 1e3, 3), s.name,
                    flag | (2 if s.status == "error" else 0), {k: _short(v) for k, v in a.items()}])
    lane_rows = []
    for (host, rank, pid), _ in sorted(lanes.items(), key=lambda kv: kv[1]):
        label = f"{host} / rank {rank}" if rank >= 0 else f"{host} / pid {pid}"
        lane_rows.append({"label": label, "host": host, "rank": rank if rank >= 0 else None,
                          "straggler": rank >= 0 and rank == worst})
    return lane_rows, out, note


def _series_key(p: MetricPoint) -> str:
    parts = [str(p.resource[k]) for k in ("host.name",) if k in p.resource]
    if "ml.rank" in p.resource:
        parts.append(f"rank {p.resource['ml.rank']}")
    elif "process.pid" in p.resource:
        parts.append(f"pid {p.resource['process.pid']}")
    parts += [f"{k}={v}" for k, v in sorted(p.attributes.items()) if k != "host.name"]
    return " ".join(parts) or str(p.resource.get("service.name", "-"))


def _point_value(p: MetricPoint) -> float | None:
    return p.value if p.kind in ("sum", "gauge") else p.sum


def _charts(points: list[MetricPoint], t0: int) -> list[dict[str, Any]]:
    by_name: dict[str, list[MetricPoint]] = defaultdict(list)
    for p in points:
        if not p.name.startswith("otel_ebpf.") and _point_value(p) is not None:
            by_name[p.name].append(p)

    def order(name: str) -> tuple[int, str]:
        return next(i for i, pre in enumerate(_CHART_PREFIXES) if name.startswith(pre)), name

    charts = []
    for name in sorted(by_name, key=order)[:MAX_CHARTS]:
        pts = by_name[name]
        series: dict[str, list[list[float]]] = defaultdict(list)
        for p in pts:
            v = _point_value(p)
            assert v is not None
            series[_series_key(p)].append([round((p.time_ns - t0) / 1e3, 3), v])
        top = sorted(series.items(), key=lambda kv: -abs(kv[1][-1][1]))[:MAX_SERIES]
        p0 = pts[0]
        what = {"sum": "cumulative total" if p0.temporality == "cumulative" else "per interval",
                "gauge": "value", "histogram": "sum of observations"}.get(p0.kind, p0.kind)
        charts.append({"name": name, "unit": p0.unit, "kind": p0.kind, "what": what, "description": p0.description,
                       "series": [{"label": k, "points": v[:: max(1, len(v) // MAX_POINTS)][:MAX_POINTS]}
                                  for k, v in top], "series_total": len(series)})
    return charts


def _dropped(points: Iterable[MetricPoint]) -> tuple[int, list[dict[str, Any]]]:
    """The last cumulative value (or the sum of deltas) of each otel_ebpf.events.dropped series,
    summed per (host + service, receiver, reason) over the agents that reported it."""
    last: dict[tuple[str, str, str, str], float] = {}
    for p in points:
        if p.name == DROPPED and p.value is not None:
            who = (str(p.resource.get("host.name", "")) + " " + str(p.resource.get("service.name", ""))).strip()
            key = (str(p.resource.get("service.instance.id", "")), who, str(p.attributes.get("receiver", "")),
                   str(p.attributes.get("reason", "")))
            last[key] = p.value if p.temporality != "delta" else last.get(key, 0.0) + p.value
    per: Counter[tuple[str, str, str]] = Counter()
    for (_, *rest), v in last.items():
        per[(rest[0], rest[1], rest[2])] += int(v)
    rows = [{"source": k[0], "receiver": k[1], "reason": k[2], "value": v} for k, v in sorted(per.items())]
    return sum(per.values()), rows


def _top_slow(spans: list[SpanRow], t0: int, top: int) -> list[dict[str, Any]]:
    rows = sorted((s for s in spans if not is_collective_root(s)), key=lambda s: -s.duration_ns)[:top]
    return [{"name": s.name, "dur_ms": s.duration_ns / 1e6, "process": _process(s), "rank": _rank(s),
             "host": s.resource.get("host.name", ""), "start": (s.start_ns - t0) / 1e3,
             "status": s.status} for s in rows]


def _why_late(roots: list[dict[str, Any]]) -> list[list[Any]]:
    """[figure, straggler ms, peers' median ms], the top 3 (otel_ebpf.host.timeline.why_late)."""
    return [list(r) for r in why_late(straggler_figures(c["attrs"]) for c in roots)[:3]]


def _header(data: OtlpData, spans: list[SpanRow], roots: list[dict[str, Any]], t0: int, t1: int) -> dict[str, Any]:
    ranks = sorted({r for s in spans if (r := _rank(s)) is not None})
    hosts = sorted({str(h) for s in spans if (h := s.resource.get("host.name"))})
    complete = [c for c in roots if not c["partial"]]
    counts = Counter((c["straggler_rank"], c["straggler_host"]) for c in complete if c["straggler_rank"] is not None)
    straggler = None
    if counts:
        (rank, host), n = counts.most_common(1)[0]
        straggler = {"rank": rank, "host": host, "count": n, "of": len(complete),
                     "why": _why_late([c for c in complete if c["straggler_rank"] == rank])}
    skews = [c["skew_ms"] for c in complete if c["skew_ms"] is not None]
    dropped, dropped_rows = _dropped(data.metrics)
    return {"t0_ns": t0, "span_us": (t1 - t0) / 1e3, "ranks": ranks, "hosts": hosts,
            "processes": len({(s.resource.get("host.name"), s.resource.get("process.pid")) for s in spans}),
            "spans": len(spans), "errors": sum(1 for s in spans if s.status == "error"),
            "metric_points": len(data.metrics), "metric_names": len({p.name for p in data.metrics}),
            "collectives": len(roots), "complete": len(complete), "partial": len(roots) - len(complete),
            "desyncs": sum(len(c["desyncs"]) for c in roots), "straggler": straggler,
            "skew_p50_ms": statistics.median(skews) if skews else None, "skew_max_ms": max(skews) if skews else None,
            "dropped": dropped, "dropped_by": dropped_rows, "bad_lines": data.bad_lines, "files": data.files}


# the log records of hang forensics (issue 17): agents' silent-rank stacks, the gateway's desync reports and
# persistent stragglers (processors/nccl_watch, processors/collective_join/hangs.py, stragglers.py)
FORENSICS = ("otel_ebpf.nccl.desync", "otel_ebpf.nccl.straggler", "otel_ebpf.nccl.rank.stack")
_BODY_CHARS = 8192


def _forensics(logs: list[LogRow], t0: int, cap: int) -> list[dict[str, Any]]:
    """The newest ``cap`` hang-forensics records, oldest first: what, when, who, and the body (a stack)."""
    rows = sorted((r for r in logs if r.event_name in FORENSICS), key=lambda r: r.time_ns)[-cap:]
    out = []
    for r in rows:
        body = str(r.body or "")
        who = r.resource.get("host.name") or ""
        if "process.pid" in r.resource and r.event_name.endswith("rank.stack"):
            who = f"{who} pid {r.resource['process.pid']}"
        out.append({"t": (r.time_ns - t0) / 1e3 if r.time_ns else None, "event": r.event_name,
                    "severity": r.severity_text, "who": who, "title": body.split("\n", 1)[0][:300],
                    "body": body[:_BODY_CHARS], "attrs": {k: _short(v) for k, v in r.attributes.items()}})
    return out


def build(data: OtlpData, *, max_spans: int = DEFAULT_MAX_SPANS, top: int = 25, title: str = "") -> dict[str, Any]:
    """The report's data (JSON-ready). ``max_spans`` caps the timeline; ``top`` the tables."""
    spans = data.spans
    times = [s.start_ns for s in spans] + [p.time_ns for p in data.metrics if p.time_ns]
    t0 = min(times) if times else 0
    t1 = max([s.end_ns for s in spans] + [p.time_ns for p in data.metrics] + [t0])
    root_rows = [s for s in spans if is_collective_root(s)]
    roots = [_collective(s, t0) for s in root_rows]
    lanes, tl, note = _timeline([s for s in spans if not is_collective_root(s)], roots, t0, max_spans)
    by_skew = sorted((c for c in roots if c["skew_ms"] is not None or c["partial"]),
                     key=lambda c: (not c["partial"], -(c["skew_ms"] or 0.0)))[:top]
    return {"title": title, "meta": _header(data, spans, roots, t0, t1), "lanes": lanes, "spans": tl,
            "span_note": note, "collectives": roots[-max_spans:], "charts": _charts(data.metrics, t0),
            "forensics": _forensics(data.logs, t0, top * 2),
            "top_slow": _top_slow(spans, t0, top),
            "by_skew": [{k: c[k] for k in ("op", "seq", "skew_ms", "straggler_rank", "straggler_host", "arrived",
                                           "nranks", "partial", "missing", "start")} for c in by_skew]}
