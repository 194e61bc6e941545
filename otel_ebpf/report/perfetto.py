"""OTLP JSON lines -> Chrome Trace Event Format JSON, which ui.perfetto.dev and chrome://tracing open.

Mapping (Trace Event Format, "JSON Object Format": ``{"traceEvents": [...], "displayTimeUnit": ...}``):

* every span is a complete event (``ph: "X"``, ``ts``/``dur`` in microseconds from the earliest
  span or point, 3 decimals so nanoseconds survive; the epoch of ``ts == 0`` is in
  ``otherData.t0_unix_ns``), ``args`` = its attributes plus ids and status;
* ``pid`` = one traced process (host + process.pid), named by metadata events
  (``process_name`` "node-1 rank 3: python3.11 (pid 4242)", sorted by rank); collectives joined
  across ranks get their own process "collectives (joined)", one thread per communicator;
* ``tid`` = the span's ``thread.id`` lane; spans of one thread that overlap without nesting
  (which the format cannot draw on one track) move to extra lanes "thread N (overlap k)";
* span events (e.g. ``nccl.desync``) are instant events (``ph: "i"``, thread scope);
* metric points are counter events (``ph: "C"``) on their process (or "metrics" when the
  resource has no process): one track per metric name, one ``args`` key per series; histograms
  plot their sum.

Events are sorted by ``ts`` (metadata first). Pure functions except :func:`write_chrome_trace`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from otel_ebpf.report.otlpfiles import MetricPoint, OtlpData, SpanRow, read_otlp_json

__all__ = ["to_chrome_trace", "write_chrome_trace"]

_COLLECTIVES = "collectives (joined)"


def _us(ns: int, t0: int) -> float:
    return round((ns - t0) / 1e3, 3)


def _json_safe(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


class _Ids:
    """Small integer pids/tids, and the metadata events naming them."""

    def __init__(self) -> None:
        self.pids: dict[tuple[Any, ...], int] = {}
        self.tids: dict[tuple[int, Any], int] = {}
        self.meta: list[dict[str, Any]] = []

    def pid(self, key: tuple[Any, ...], name: str, sort: int) -> int:
        if key not in self.pids:
            pid = self.pids[key] = len(self.pids) + 1
            self.meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}})
            self.meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                              "args": {"sort_index": sort}})
        return self.pids[key]

    def tid(self, pid: int, key: Any, name: str) -> int:
        if (pid, key) not in self.tids:
            tid = self.tids[(pid, key)] = sum(1 for p, _ in self.tids if p == pid) + 1
            self.meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                              "args": {"name": name}})
        return self.tids[(pid, key)]


def _process_of(ids: _Ids, resource: dict[str, Any], rank: Any) -> int:
    host = resource.get("host.name", "")
    pid = resource.get("process.pid")
    if pid is None:
        return ids.pid(("metrics", host, resource.get("service.name")), f"{host} {resource.get('service.name', '')} "
                       "metrics".strip(), 1_000_000)
    exe = resource.get("process.executable.name") or resource.get("service.name") or "process"
    label = f"{host} rank {rank}: {exe} (pid {pid})" if rank is not None else f"{host}: {exe} (pid {pid})"
    return ids.pid((host, pid), label.strip(), int(rank) if isinstance(rank, int) else 10_000 + int(pid))


def _rank(s: SpanRow) -> Any:
    return s.resource.get("ml.rank", s.attributes.get("nccl.rank"))


def _is_root(s: SpanRow) -> bool:
    a = s.attributes
    return "nccl.ranks.arrived" in a and "nccl.rank" not in a and not s.parent_span_id


class _Lanes:
    """Per (pid, thread): stacks of open spans; a span goes to the first lane where it nests."""

    def __init__(self) -> None:
        self.stacks: dict[tuple[int, Any], list[list[int]]] = {}

    def place(self, key: tuple[int, Any], start: int, end: int) -> int:
        lanes = self.stacks.setdefault(key, [])
        for i, stack in enumerate(lanes):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                return i
        lanes.append([end])
        return len(lanes) - 1


def _span_events(data: OtlpData, ids: _Ids, t0: int) -> list[dict[str, Any]]:
    lanes, out = _Lanes(), []
    for s in sorted(data.spans, key=lambda s: (s.start_ns, -s.end_ns)):
        if _is_root(s):
            pid = ids.pid((_COLLECTIVES,), _COLLECTIVES, -1)
            thread: Any = f"comm {s.attributes.get('nccl.comm.id', '?')}"
        else:
            pid = _process_of(ids, s.resource, _rank(s))
            thread = s.attributes.get("thread.id", s.resource.get("process.pid", 0))
        lane = lanes.place((pid, thread), s.start_ns, s.end_ns)
        name = thread if isinstance(thread, str) else f"thread {thread}"
        tid = ids.tid(pid, (thread, lane), name + (f" (overlap {lane})" if lane else ""))
        args = {k: _json_safe(v) for k, v in s.attributes.items()}
        args.update({"trace_id": s.trace_id, "span_id": s.span_id, "parent_span_id": s.parent_span_id,
                     "status": s.status})
        out.append({"ph": "X", "name": s.name, "cat": s.scope or "span", "pid": pid, "tid": tid,
                    "ts": _us(s.start_ns, t0), "dur": round(s.duration_ns / 1e3, 3), "args": args})
        for e in s.events:
            out.append({"ph": "i", "s": "t", "name": e.name, "cat": s.scope or "span", "pid": pid, "tid": tid,
                        "ts": _us(e.time_ns, t0), "args": {k: _json_safe(v) for k, v in e.attributes.items()}})
    return out


def _series(p: MetricPoint) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(p.attributes.items())) or "value"


def _counter_events(data: OtlpData, ids: _Ids, t0: int) -> list[dict[str, Any]]:
    out = []
    for p in data.metrics:
        v = p.value if p.kind in ("sum", "gauge") else p.sum
        if v is None or not p.time_ns:
            continue
        pid = _process_of(ids, p.resource, p.resource.get("ml.rank"))
        unit = f" [{p.unit}]" if p.unit and p.unit != "1" else ""
        out.append({"ph": "C", "name": p.name + unit, "pid": pid, "tid": 0, "ts": _us(p.time_ns, t0),
                    "args": {_series(p): v}})
    return out


def to_chrome_trace(data: OtlpData) -> dict[str, Any]:
    """The Trace Event Format object for ``data`` (JSON-ready)."""
    times = [s.start_ns for s in data.spans] + [p.time_ns for p in data.metrics if p.time_ns]
    t0 = min(times) if times else 0
    ids = _Ids()
    if any(_is_root(s) for s in data.spans):  # first: the joined view on top
        ids.pid((_COLLECTIVES,), _COLLECTIVES, -1)
    events = _span_events(data, ids, t0) + _counter_events(data, ids, t0)
    events.sort(key=lambda e: e["ts"])
    return {"traceEvents": ids.meta + events, "displayTimeUnit": "ms",
            "otherData": {"t0_unix_ns": t0, "generator": "otel-ebpf", "spans": len(data.spans),
                          "metric_points": len(data.metrics), "bad_lines": data.bad_lines}}


def write_chrome_trace(source: str | os.PathLike[str], output: str | os.PathLike[str]) -> Path:
    """Read OTLP JSON lines under ``source`` (directory or file) and write the trace JSON to ``output``."""
    trace = to_chrome_trace(read_otlp_json(source))
    out = Path(output)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(trace, fh, separators=(",", ":"), default=str)
    tmp.replace(out)
    return out
