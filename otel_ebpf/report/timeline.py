"""The report's timeline: one lane per process, one row per (thread, source) inside it.

A lane is a process (host, pid; its rank in the label when it has one). Inside it, spans are put
on rows by thread (``thread.id``; the main thread, tid == pid, first) and by source, from the
span's instrumentation scope: Python calls, torch operators, CUDA calls, NCCL calls, NCCL's GPU
time (the profiler plugin's spans, ``nccl.timing=gpu``: no thread of their own), then any other
receiver. Nested spans on a row (a Python call inside another) stack downwards as levels, at most
:data:`MAX_LEVELS` (deeper ones share the last level). The process-lifetime span (the lifecycle
processor's ``process <name>`` span, fork to exit; the sched processor's in output written before
issue 18) is not a row: it is the lane's bracket, drawn collapsed in the lane's header, so it
does not cover the work inside it.

Times are microseconds from ``t0`` (the first span's start). Pure functions; no I/O.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from otel_ebpf.report.otlpfiles import SpanRow

__all__ = ["MAX_LEVELS", "NCCL_GPU", "SOURCES", "is_process_span", "lanes_and_spans", "rank_of", "short", "source_of"]

MAX_LEVELS = 8
# scope -> row label, in row order; other scopes follow, named by their scope's last part
SOURCES = {"otel_ebpf.python": "Python", "otel_ebpf.torch": "torch ops", "otel_ebpf.cuda": "CUDA",
           "otel_ebpf.nccl": "NCCL"}
NCCL_GPU = "NCCL on GPU"  # nccl.timing=gpu: the plugin's GPU time of a call (processors/nccl), no thread
_ORDER = {label: i for i, label in enumerate([*SOURCES.values(), NCCL_GPU])}
# processors/lifecycle (processors/sched before issue 18): one 'process <exe>' span per traced process
_PROCESS_SCOPES = ("otel_ebpf.lifecycle", "otel_ebpf.sched")
_ATTR_CHARS = 200  # longest attribute value shown on hover


def short(v: Any) -> Any:
    """An attribute value cut for hover text (strings to 200 characters, arrays to 32 items)."""
    if isinstance(v, str) and len(v) > _ATTR_CHARS:
        return v[:_ATTR_CHARS] + "..."
    if isinstance(v, tuple):
        return [short(x) for x in v[:32]]
    return v


def is_process_span(s: SpanRow) -> bool:
    """The process-lifetime span: fork (or first exec) to exit, from the lifecycle (formerly sched) processor."""
    return s.scope in _PROCESS_SCOPES and s.name.startswith("process")


def source_of(s: SpanRow) -> str:
    """The row label of a span's source: Python, torch ops, CUDA, NCCL, NCCL on GPU, else its scope's last part."""
    if s.attributes.get("nccl.timing") == "gpu":
        return NCCL_GPU
    if s.scope in SOURCES:
        return SOURCES[s.scope]
    if s.name.startswith("nccl"):
        return "NCCL"
    return s.scope.rsplit(".", 1)[-1] or "other"


def rank_of(s: SpanRow) -> int | None:
    r = s.attributes.get("nccl.rank", s.resource.get("ml.rank"))
    try:
        return None if r is None else int(r)
    except (TypeError, ValueError):
        return None


def _pid(s: SpanRow) -> int:
    pid = s.resource.get("process.pid", s.attributes.get("process.pid", 0))
    return pid if isinstance(pid, int) else 0


def _lane_key(s: SpanRow) -> tuple[str, int]:
    return str(s.resource.get("host.name", "?")), _pid(s)


def _thread(s: SpanRow) -> int | None:
    tid = s.attributes.get("thread.id")
    return tid if isinstance(tid, int) else None


def _levels(spans: list[tuple[int, int, int]]) -> dict[int, int]:
    """{index: nesting level} for (index, start, end) on one row: a span starting before the
    one above it ends sits one level down (at most MAX_LEVELS - 1)."""
    out: dict[int, int] = {}
    ends: list[int] = []
    for i, start, end in sorted(spans, key=lambda x: (x[1], -x[2])):
        while ends and ends[-1] <= start:
            ends.pop()
        out[i] = min(len(ends), MAX_LEVELS - 1)
        ends.append(end)
    return out


def _lane(key: tuple[str, int], members: list[SpanRow], life: SpanRow | None, rank: int | None,
          t0: int) -> tuple[dict[str, Any], dict[tuple[int | None, str], int]]:
    host, pid = key
    ref = life or members[0]
    exe = ref.resource.get("process.executable.name") or ref.resource.get("service.name") or ""
    if not exe and life is not None:
        exe = life.name.removeprefix("process").strip()
    who = f"{exe or 'pid'} {pid}" if pid else (exe or "?")
    label = f"{host} / rank {rank} / {who}" if rank is not None else f"{host} / {who}"
    row_keys = sorted({(_thread(s), source_of(s)) for s in members},
                      key=lambda k: (k[0] is None, k[0] != pid, k[0] or 0, _ORDER.get(k[1], 99), k[1]))
    rows = {k: i for i, k in enumerate(row_keys)}
    lane: dict[str, Any] = {"label": label, "host": host, "rank": rank, "pid": pid or None, "straggler": False,
                            "rows": [{"thread": t, "source": src, "levels": 1,
                                      "label": (("main thread" if t == pid else f"thread {t}") + " \u00b7 "
                                                if t is not None else "") + src}
                                     for t, src in row_keys],
                            "process": None}
    if life is not None:
        lane["process"] = {"name": life.name, "start": round((life.start_ns - t0) / 1e3, 3),
                           "dur": round(life.duration_ns / 1e3, 3), "error": life.status == "error",
                           "attrs": {k: short(v) for k, v in life.attributes.items()}}
    return lane, rows


def lanes_and_spans(spans: Iterable[SpanRow], stragglers: dict[tuple[Any, Any], Any], worst: int | None,
                    t0: int) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    """Lanes (processes, their rows and bracket) and the drawn spans ``[lane, row, start us, dur us,
    name, flags (1: the straggler's span of a collective, 2: error), attrs, level]``. ``stragglers``
    maps (comm, seq) of complete collectives to the last rank; ``worst`` is the most frequent one."""
    spans = list(spans)
    lives: dict[tuple[str, int], SpanRow] = {}
    by_lane: dict[tuple[str, int], list[SpanRow]] = {}
    ranks: dict[tuple[str, int], Counter[int]] = {}
    for s in spans:
        key = _lane_key(s)
        if is_process_span(s):
            if key not in lives or s.duration_ns > lives[key].duration_ns:
                lives[key] = s
            by_lane.setdefault(key, [])
            continue
        by_lane.setdefault(key, []).append(s)
        if (r := rank_of(s)) is not None:
            ranks.setdefault(key, Counter())[r] += 1
    rank = {k: c.most_common(1)[0][0] for k, c in ranks.items()}
    order = sorted(by_lane, key=lambda k: (k not in rank, rank.get(k, 0), k[0], k[1]))
    lanes: list[dict[str, Any]] = []
    out: list[list[Any]] = []
    for li, key in enumerate(order):
        members = by_lane[key]
        lane, rows = _lane(key, members, lives.get(key), rank.get(key), t0)
        lane["straggler"] = worst is not None and rank.get(key) == worst
        per_row: dict[int, list[tuple[int, int, int]]] = {}
        first = len(out)
        for s in members:
            row = rows[(_thread(s), source_of(s))]
            a = s.attributes
            flag = 2 if s.status == "error" else 0
            if "nccl.seq" in a and rank.get(key) is not None and \
                    stragglers.get((a.get("nccl.comm.id"), a.get("nccl.seq"))) == rank_of(s):
                flag |= 1  # the straggler's own span of that collective
            per_row.setdefault(row, []).append((len(out), s.start_ns, s.end_ns))
            out.append([li, row, round((s.start_ns - t0) / 1e3, 3), round(s.duration_ns / 1e3, 3), s.name, flag,
                        {k: short(v) for k, v in a.items()}, 0])
        for row, items in per_row.items():
            levels = _levels(items)
            for i, level in levels.items():
                out[i][7] = level
            lane["rows"][row]["levels"] = max(levels.values()) + 1
        lane["spans"] = len(out) - first
        lanes.append(lane)
    return lanes, out
