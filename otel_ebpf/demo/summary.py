"""What the gateway made of the demo's job, read back from its OTLP JSON lines files.

:func:`read` parses ``traces.jsonl`` as the file exporter writes it (OTLP/JSON: one export
request per line, hex ids, attribute values as ``{"stringValue": ...}``, 64-bit integers as
strings); malformed lines are counted in :attr:`Summary.bad_lines`, never raised. It keeps
the joined collectives: root spans (``nccl.comm.id`` + ``nccl.seq``, no ``nccl.rank``, no
parent) that carry the join's ``nccl.ranks.arrived``. :func:`render` turns a
:class:`Summary` into the text the demo prints. Pure functions; no OTel SDK.
"""
from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_ebpf.host.timeline import straggler_figures, why_late
from otel_ebpf.report.otlpfiles import decode_attributes

__all__ = ["Collective", "Desync", "Summary", "decode_attributes", "html_report", "read", "render"]


@dataclass(frozen=True)
class Desync:
    """One ``nccl.desync`` span event: a collective still waiting for ranks."""

    op: str
    seq: int
    missing_ranks: tuple[int, ...]
    missing_hosts: tuple[str, ...]
    waited_ms: float


@dataclass(frozen=True)
class Collective:
    """One joined collective (its root span)."""

    op: str
    seq: int
    arrived: int
    partial: bool
    missing_ranks: tuple[int, ...]
    skew_ns: int | None
    straggler_rank: int | None
    straggler_host: str | None
    desyncs: tuple[Desync, ...] = ()
    # the straggler's step figures and the other ranks' median (otel_ebpf.host.timeline.straggler_figures)
    figures: tuple[tuple[str, float, float], ...] = ()


@dataclass
class Summary:
    collectives: list[Collective] = field(default_factory=list)
    rank_hosts: dict[int, str] = field(default_factory=dict)  # nccl.rank -> host.name of its spans
    spans: int = 0
    bad_lines: int = 0

    @property
    def complete(self) -> list[Collective]:
        return [c for c in self.collectives if not c.partial]

    @property
    def partial(self) -> list[Collective]:
        return [c for c in self.collectives if c.partial]

    @property
    def desyncs(self) -> list[Desync]:
        return [d for c in self.collectives for d in c.desyncs]

    def straggler(self) -> tuple[int, str, int] | None:
        """(rank, host, in how many complete collectives) of the most frequent straggler."""
        counts = Counter((c.straggler_rank, c.straggler_host or "") for c in self.complete
                         if c.straggler_rank is not None)
        if not counts:
            return None
        (rank, host), n = counts.most_common(1)[0]
        assert rank is not None
        return rank, host, n

    def late_figures(self, rank: int) -> list[tuple[tuple[str, float, float], ...]]:
        """The step figures of each complete collective ``rank`` was the straggler of."""
        return [c.figures for c in self.complete if c.straggler_rank == rank and c.figures]

    def skew_ms(self) -> tuple[float, float] | None:
        """(p50, max) of the complete collectives' skew, in ms."""
        skews = [c.skew_ns / 1e6 for c in self.complete if c.skew_ns is not None]
        return (statistics.median(skews), max(skews)) if skews else None


def _spans(line: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(resource attributes, span, span attributes) of every span of one export request."""
    out = []
    for rs in line.get("resourceSpans", []):
        resource = decode_attributes(rs.get("resource", {}).get("attributes", []))
        for ss in rs.get("scopeSpans", []):
            out += [(resource, span, decode_attributes(span.get("attributes", []))) for span in ss.get("spans", [])]
    return out


def _desyncs(span: dict[str, Any], op: str, seq: int) -> tuple[Desync, ...]:
    out = []
    for ev in span.get("events", []):
        if ev.get("name") == "nccl.desync":
            a = decode_attributes(ev.get("attributes", []))
            out.append(Desync(op, seq, tuple(a.get("nccl.missing_ranks", ())), tuple(a.get("nccl.missing.hosts", ())),
                              a.get("nccl.waited_ns", 0) / 1e6))
    return tuple(out)


def _collective(span: dict[str, Any], a: dict[str, Any]) -> Collective:
    op, seq = str(a.get("nccl.op", "collective")), int(a["nccl.seq"])
    return Collective(op=op, seq=seq, arrived=int(a["nccl.ranks.arrived"]), partial=bool(a.get("nccl.partial")),
                      missing_ranks=tuple(a.get("nccl.missing_ranks", ())), skew_ns=a.get("nccl.skew_ns"),
                      straggler_rank=a.get("nccl.straggler.rank"), straggler_host=a.get("nccl.straggler.host"),
                      desyncs=_desyncs(span, op, seq), figures=tuple(straggler_figures(a)))


def read(traces: str | Path) -> Summary:
    """Summarise a gateway's ``traces.jsonl``; a missing file gives an empty Summary."""
    summary = Summary()
    try:
        text = Path(traces).read_text(encoding="utf-8")
    except OSError:
        return summary
    for raw in text.splitlines():
        if not raw.strip():
            continue
        try:
            rows = _spans(json.loads(raw))
        except (ValueError, TypeError, AttributeError, KeyError):
            summary.bad_lines += 1
            continue
        for resource, span, a in rows:
            summary.spans += 1
            if "nccl.rank" in a and "nccl.seq" in a and "host.name" in resource:
                summary.rank_hosts[int(a["nccl.rank"])] = str(resource["host.name"])
            elif ("nccl.comm.id" in a and "nccl.seq" in a and "nccl.ranks.arrived" in a
                  and not span.get("parentSpanId")):
                try:
                    summary.collectives.append(_collective(span, a))
                except (ValueError, TypeError, KeyError):
                    summary.bad_lines += 1
    summary.collectives.sort(key=lambda c: (c.seq, c.op))
    return summary


def html_report(out: str | Path) -> str:
    """Write ``out/report.html`` (otel_ebpf.report) from the files there; returns its path, or a
    line saying why it could not be written. Never raises."""
    from otel_ebpf.report import write_report

    try:
        return str(write_report(out, Path(out) / "report.html", title="otel-ebpf demo"))
    except (OSError, ValueError) as exc:
        return f"none: the HTML report could not be written: {exc}"


def _figure(name: str) -> str:
    """``off_cpu.sleep`` -> ``off-CPU (sleep)``."""
    parts = name.split(".")
    base = {"off_cpu": "off-CPU", "on_cpu": "on-CPU", "runq": "run queue", "io": "IO"}.get(parts[0], parts[0])
    return base + (f" ({parts[1]})" if len(parts) > 1 else "")


def _ranks(ranks: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(r) for r in ranks) or "-"


def _verdict(found: int | None, injected: int | None) -> str:
    if injected is None:
        return "(none injected)"
    return f"(injected: rank {injected}: {'FOUND' if found == injected else 'NOT found'})"


def render(s: Summary, *, straggler: int | None, killed: int | None, out_dir: str | Path,
           report: str | Path | None = None) -> str:
    """The demo's closing report. ``straggler``/``killed``: the injected ranks, or None.
    ``report``: the HTML report written (or a line saying why there is none)."""
    out = Path(out_dir)
    hosts = sorted(set(s.rank_hosts.values()))
    lines = [f"collectives joined: {len(s.collectives)} ({len(s.complete)} complete, {len(s.partial)} partial) "
             f"from {len(s.rank_hosts)} ranks on {len(hosts)} hosts ({', '.join(hosts) or '-'})"]
    top = s.straggler()
    if top is None:
        lines.append(f"straggler: none found (no complete collective) {_verdict(None, straggler)}")
    else:
        rank, host, n = top
        lines.append(f"straggler: rank {rank} on {host or '?'}, last to arrive in {n}/{len(s.complete)} complete "
                     f"collectives {_verdict(rank, straggler)}")
        figures = s.late_figures(rank)
        why = why_late(figures)  # at least 1 ms more than its peers, medians over those collectives
        if why:  # the sched receiver's step figures, copied by the gateway (median over those collectives)
            lines.append("why late: in the step before, rank " + str(rank) + " spent " + "; ".join(
                f"{_figure(f)} {m:.1f} ms (peers' median {p:.1f} ms)" for f, m, p in why[:3]))
        elif figures:
            lines.append(f"why late: rank {rank}'s host figures (CPU, run queue, off-CPU) match its peers': "
                         "the delay is not on the host (GPU, network or input?)")
    skew = s.skew_ms()
    lines.append("skew (first to last rank arrival): "
                 + (f"p50 {skew[0]:.1f} ms, max {skew[1]:.1f} ms" if skew else "-"))
    for c in s.partial[:5]:
        lines.append(f"partial: {c.op} seq {c.seq}: {c.arrived} ranks arrived, missing ranks "
                     f"{_ranks(c.missing_ranks)}")
    if len(s.partial) > 5:
        lines.append(f"partial: ... {len(s.partial) - 5} more")
    for d in s.desyncs[:5]:
        lines.append(f"desync: {d.op} seq {d.seq} waited {d.waited_ms / 1000:.1f}s for ranks {_ranks(d.missing_ranks)} "
                     f"(hosts {', '.join(d.missing_hosts) or '?'})")
    if killed is not None:
        seen = any(killed in c.missing_ranks for c in s.partial) and any(killed in d.missing_ranks for d in s.desyncs)
        verdict = "FOUND (partial collective + desync event)" if seen else "NOT found"
        lines.append(f"injected crash of rank {killed}: {verdict}")
    lines += [f"files: {out / 'traces.jsonl'} ({s.spans} spans), {out / 'metrics.jsonl'}, logs in {out / 'logs'}",
              f"browse: otelcol-contrib --config {out / 'otelcol-jaeger.yaml'} (otlpjsonfile receiver -> OTLP "
              "to Jaeger on 127.0.0.1:4317), then http://127.0.0.1:16686, service 'otel-ebpf-demo'"]
    if report is not None:
        lines.insert(len(lines) - 1, f"report: {report}" + (" (open it in a browser; it needs no network)"
                                                             if str(report).endswith(".html") else ""))
    if s.bad_lines:
        lines.append(f"({s.bad_lines} unreadable lines skipped)")
    return "\n".join(f"  {line}" for line in lines)
