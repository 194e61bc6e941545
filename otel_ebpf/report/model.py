"""What the HTML report shows, computed from OTLP rows: lanes, collectives, charts, tables, header.

:func:`build` returns plain JSON-ready data (the page embeds it and draws it with its own JS).
Times in the data are microseconds from the first span's start (``meta.t0_ns``; from the first
metric reading when there are no spans), so the numbers stay small. The time span in the header
is the first span's start to the last span's end: metrics read before the traced work began or
after it ended (the agent collects while its probes compile and while it flushes) do not stretch it.
Everything is bounded: at most ``max_spans`` spans on the timeline (collective spans of ranks
first, then the slowest others; the page says how many were left out), ``MAX_CHARTS`` charts
(:mod:`.charts`), ``top`` rows per table. The timeline's lanes and rows are :mod:`.timeline`.

Drops: ``otel_ebpf.events.dropped`` reasons in ``NOT_LOST_REASONS`` (otel_ebpf/core/telemetry.py:
what a limit left unrecorded, not data lost) are counted apart (``meta.not_recorded``) from losses
(``meta.dropped``). Pure function; no I/O.
"""
from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

from otel_ebpf.core.telemetry import DROPPED, NOT_LOST_REASONS, is_lost
from otel_ebpf.host.timeline import straggler_figures, why_late
from otel_ebpf.report import charts as charts_
from otel_ebpf.report.otlpfiles import LogRow, MetricPoint, OtlpData, SpanRow
from otel_ebpf.report.timeline import is_process_span, lanes_and_spans, rank_of, short

__all__ = ["DEFAULT_MAX_SPANS", "build", "is_collective_root", "time_range"]

DEFAULT_MAX_SPANS = 20_000


def is_collective_root(s: SpanRow) -> bool:
    """A collective joined across ranks by the gateway (no rank of its own, no parent)."""
    a = s.attributes
    return "nccl.ranks.arrived" in a and "nccl.seq" in a and "nccl.rank" not in a and not s.parent_span_id


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
            "attrs": {k: short(v) for k, v in a.items()}}


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
    lives = [s for s in spans if is_process_span(s)]  # brackets, not bars: never capped
    kept, note = _keep([s for s in spans if not is_process_span(s)], cap)
    lanes, out = lanes_and_spans(lives + kept, stragglers, worst, t0)
    return lanes, out, note


def _dropped(points: Iterable[MetricPoint]) -> tuple[int, int, list[dict[str, Any]]]:
    """(events lost, events not recorded by a limit, rows): the last cumulative value (or the sum of
    deltas) of each otel_ebpf.events.dropped series, summed per (host + service, receiver, reason)
    over the agents that reported it; a row's ``lost`` is False for NOT_LOST_REASONS."""
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
    lost = sum(v for k, v in per.items() if is_lost(k[2]))
    rows = [{"source": k[0], "receiver": k[1], "reason": k[2], "value": v, "lost": is_lost(k[2]),
             "why": NOT_LOST_REASONS.get(k[2], "")} for k, v in sorted(per.items()) if v]
    return lost, sum(per.values()) - lost, rows


def _top_slow(spans: list[SpanRow], t0: int, top: int) -> list[dict[str, Any]]:
    rows = sorted((s for s in spans if not is_collective_root(s) and not is_process_span(s)),
                  key=lambda s: -s.duration_ns)[:top]
    return [{"name": s.name, "dur_ms": s.duration_ns / 1e6, "process": _process(s), "rank": rank_of(s),
             "host": s.resource.get("host.name", ""), "start": (s.start_ns - t0) / 1e3,
             "status": s.status} for s in rows]


def _why_late(roots: list[dict[str, Any]]) -> list[list[Any]]:
    """[figure, straggler ms, peers' median ms], the top 3 (otel_ebpf.host.timeline.why_late)."""
    return [list(r) for r in why_late(straggler_figures(c["attrs"]) for c in roots)[:3]]


def _header(data: OtlpData, spans: list[SpanRow], roots: list[dict[str, Any]], t0: int, t1: int,
            lanes: list[dict[str, Any]]) -> dict[str, Any]:
    ranks = sorted({r for s in spans if (r := rank_of(s)) is not None})
    hosts = sorted({str(h) for s in spans if (h := s.resource.get("host.name"))})
    complete = [c for c in roots if not c["partial"]]
    counts = Counter((c["straggler_rank"], c["straggler_host"]) for c in complete if c["straggler_rank"] is not None)
    straggler = None
    if counts:
        (rank, host), n = counts.most_common(1)[0]
        straggler = {"rank": rank, "host": host, "count": n, "of": len(complete),
                     "why": _why_late([c for c in complete if c["straggler_rank"] == rank])}
    skews = [c["skew_ms"] for c in complete if c["skew_ms"] is not None]
    dropped, not_recorded, dropped_rows = _dropped(data.metrics)
    return {"t0_ns": t0, "span_us": (t1 - t0) / 1e3, "ranks": ranks, "hosts": hosts,
            "processes": len(lanes), "threads": sum(len({r["thread"] for r in lane["rows"]}) for lane in lanes),
            "spans": len(spans), "errors": sum(1 for s in spans if s.status == "error"),
            "metric_points": len(data.metrics), "metric_names": len({p.name for p in data.metrics}),
            "collectives": len(roots), "complete": len(complete), "partial": len(roots) - len(complete),
            "desyncs": sum(len(c["desyncs"]) for c in roots), "straggler": straggler,
            "skew_p50_ms": statistics.median(skews) if skews else None, "skew_max_ms": max(skews) if skews else None,
            "dropped": dropped, "not_recorded": not_recorded, "dropped_by": dropped_rows,
            "bad_lines": data.bad_lines, "files": data.files}


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
                    "body": body[:_BODY_CHARS], "attrs": {k: short(v) for k, v in r.attributes.items()}})
    return out


def time_range(data: OtlpData) -> tuple[int, int]:
    """(t0, t1) in epoch ns: the first span's start to the last span's end; without spans, the first
    to the last metric reading (then log record). Metric readings outside the spans' range (taken
    while the agent started or flushed) do not widen it."""
    if data.spans:
        return min(s.start_ns for s in data.spans), max(s.end_ns for s in data.spans)
    times = [p.time_ns for p in data.metrics if p.time_ns] or [r.time_ns for r in data.logs if r.time_ns] or [0]
    return min(times), max(times)


def _exits(spans: list[SpanRow]) -> dict[tuple[str, int], int]:
    """{(host, pid): end ns} of each process-lifetime span that ended (not one still running)."""
    out: dict[tuple[str, int], int] = {}
    for s in spans:
        pid = s.attributes.get("process.pid", s.resource.get("process.pid"))
        running = s.attributes.get("process.lifecycle.running") or s.attributes.get("process.sched.running")
        if is_process_span(s) and isinstance(pid, int) and not running:
            key = (str(s.resource.get("host.name", "?")), pid)
            out[key] = max(out.get(key, 0), s.end_ns)
    return out


def build(data: OtlpData, *, max_spans: int = DEFAULT_MAX_SPANS, top: int = 25, title: str = "") -> dict[str, Any]:
    """The report's data (JSON-ready). ``max_spans`` caps the timeline; ``top`` the tables."""
    spans = data.spans
    t0, t1 = time_range(data)
    root_rows = [s for s in spans if is_collective_root(s)]
    roots = [_collective(s, t0) for s in root_rows]
    lanes, tl, note = _timeline([s for s in spans if not is_collective_root(s)], roots, t0, max_spans)
    by_skew = sorted((c for c in roots if c["skew_ms"] is not None or c["partial"]),
                     key=lambda c: (not c["partial"], -(c["skew_ms"] or 0.0)))[:top]
    return {"title": title, "meta": _header(data, spans, roots, t0, t1, lanes), "lanes": lanes, "spans": tl,
            "span_note": note, "collectives": roots[-max_spans:],
            "charts": charts_.charts(data.metrics, t0, _exits(spans)),
            "sections": [title for title, _ in charts_.SECTIONS],
            "forensics": _forensics(data.logs, t0, top * 2),
            "top_slow": _top_slow(spans, t0, top),
            "by_skew": [{k: c[k] for k in ("op", "seq", "skew_ms", "straggler_rank", "straggler_host", "arrived",
                                           "nranks", "partial", "missing", "start")} for c in by_skew]}
