"""What the gateway made of the demo's job, read back from its OTLP JSON lines files.

:func:`read` parses ``traces.jsonl`` as the file exporter writes it (OTLP/JSON: one export
request per line, hex ids, attribute values as ``{"stringValue": ...}``, 64-bit integers as
strings); malformed lines are counted in :attr:`Summary.bad_lines`, never raised. It keeps
the joined collectives: root spans (``nccl.comm.id`` + ``nccl.seq``, no ``nccl.rank``, no
parent) that carry the join's ``nccl.ranks.arrived``, and the grouped send/recv instances (root
``nccl GroupP2P`` spans, op ``GroupP2P``). Ranks are global ranks: a collective's ranks (its
straggler, missing ranks) are its communicator's, translated through the ``ml.rank`` (torchrun's
``RANK``) of each rank span's resource; where that is unknown they stay the communicator's.
:meth:`Summary.communicators` lists the communicators the gateway joined, named from the job's own
record of its groups (:func:`read_comms`: the ``comms-rank<r>.json`` files the demo's train.py
writes). :func:`render` turns a :class:`Summary` into the text the demo prints. Pure functions; no
OTel SDK.
"""
from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from otel_ebpf.host.timeline import straggler_figures, why_late
from otel_ebpf.report.otlpfiles import decode_attributes

__all__ = ["Collective", "CommName", "CommRow", "Desync", "Summary", "decode_attributes", "html_report", "read",
           "read_comms", "render"]

P2P_OP = "GroupP2P"  # the gateway's root of one grouped send/recv instance (collective_join/p2p.py)
MAX_COMM_LINES = 12


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
    comm: str = ""  # nccl.comm.id ("a,b" for a grouped send/recv over several communicators)
    nranks: int | None = None  # the communicator's size (nccl.nranks; a GroupP2P: the ranks it involved)


@dataclass(frozen=True)
class CommName:
    """One group as the job itself names it: ``members`` are global ranks in the group's rank order."""

    name: str
    members: tuple[int, ...]


@dataclass(frozen=True)
class CommRow:
    """One communicator the gateway joined collectives of (:meth:`Summary.communicators`)."""

    comm: str
    name: str  # from the job's groups; "split of <parent>" or "-" when none matches
    ranks: tuple[int | None, ...]  # global rank of each communicator rank (None: never seen)
    size: int
    complete: int
    partial: int
    ops: tuple[tuple[str, int], ...]  # (op, collectives), most frequent first


@dataclass
class Summary:
    collectives: list[Collective] = field(default_factory=list)
    rank_hosts: dict[int, str] = field(default_factory=dict)  # global rank (else nccl.rank) -> host.name
    spans: int = 0
    bad_lines: int = 0
    p2p: list[Collective] = field(default_factory=list)  # grouped send/recv instances (op GroupP2P)
    comm_ranks: dict[str, dict[int, int]] = field(default_factory=dict)  # comm id -> nccl.rank -> ml.rank
    comm_sizes: dict[str, int] = field(default_factory=dict)  # comm id -> nccl.nranks
    split_parents: dict[str, str] = field(default_factory=dict)  # child comm id -> parent (ncclCommSplit)

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
        """The step figures of the complete collectives ``rank`` was the straggler of, the quarter of them
        where it kept the others waiting longest (skew at or above that quarter's lowest). Why: a training
        step issues tens of collectives; the rank's own delay precedes only the first, and it is last to many
        others only because of it, with ordinary figures that would outvote the delay in a median."""
        late = [c for c in self.complete if c.straggler_rank == rank and c.figures]
        skews = sorted(c.skew_ns or 0 for c in late)
        if not skews:
            return []
        cut = skews[min(len(skews) - 1, 3 * len(skews) // 4)]
        return [c.figures for c in late if (c.skew_ns or 0) >= cut]

    def skew_ms(self) -> tuple[float, float] | None:
        """(p50, max) of the complete collectives' skew, in ms."""
        skews = [c.skew_ns / 1e6 for c in self.complete if c.skew_ns is not None]
        return (statistics.median(skews), max(skews)) if skews else None

    def communicators(self, names: Sequence[CommName] = ()) -> list[CommRow]:
        """Every communicator with a joined collective or grouped send/recv: its global ranks, size, counts
        and ops, named from ``names``; in the order of ``names`` (unnamed last), then largest first."""
        joined: dict[str, list[Collective]] = {}
        for c in self.collectives + self.p2p:
            for comm in filter(None, c.comm.split(",")):
                joined.setdefault(comm, []).append(c)
        rows = []
        for comm, cs in joined.items():
            ranks = self._ranks(comm, max((c.nranks or 0 for c in cs if c.op != P2P_OP), default=0))
            partial = sum(1 for c in cs if c.partial)
            rows.append(CommRow(comm, self._name(comm, ranks, names), ranks, len(ranks), len(cs) - partial,
                                partial, tuple(Counter(c.op for c in cs).most_common())))
        first: dict[str, int] = {}
        for i, n in enumerate(names):
            first.setdefault(n.name, i)
        rows.sort(key=lambda r: (first.get(r.name, len(names)), -r.size, [-1 if g is None else g for g in r.ranks],
                                 r.comm))
        return rows

    def _ranks(self, comm: str, nranks: int = 0) -> tuple[int | None, ...]:
        known = self.comm_ranks.get(comm, {})
        size = self.comm_sizes.get(comm) or nranks or (max(known) + 1 if known else 0)
        return tuple(known.get(i) for i in range(size))

    def _name(self, comm: str, ranks: tuple[int | None, ...], names: Sequence[CommName], depth: int = 0) -> str:
        """The job's name for the group with these ranks. Several groups may have the same ranks (a mesh
        dimension as large as the world): a split child is not "world", an initialised communicator is; names
        still tied are all given ("tp/ep"). No match: "split of <parent's name>", else "-"."""
        same = [n.name for n in names if n.members == ranks] or [
            n.name for n in names if len(n.members) == len(ranks) and None not in ranks
            and sorted(n.members) == sorted(r for r in ranks if r is not None)]
        parent = self.split_parents.get(comm)
        if parent is not None:
            same = [n for n in same if n != "world"]
        elif "world" in same:
            same = ["world"]
        if same:
            return "/".join(dict.fromkeys(same))
        if parent is not None and depth < 4:
            return f"split of {self._name(parent, self._ranks(parent), names, depth + 1)}"
        return "-"

    def _note(self, resource: dict[str, Any], a: dict[str, Any]) -> None:
        """Learns from any span: a communicator rank's global rank, the communicator's size, its parent."""
        comm = a.get("nccl.comm.id")
        if type(comm) is not str:
            return
        rank, grank, nranks, parent = a.get("nccl.rank"), resource.get("ml.rank"), a.get("nccl.nranks"), \
            a.get("nccl.parent.comm.id")
        if type(rank) is int and type(grank) is int:
            self.comm_ranks.setdefault(comm, {})[rank] = grank
        if type(nranks) is int and nranks > 0:
            self.comm_sizes[comm] = nranks
        if type(parent) is str and parent != comm:
            self.split_parents[comm] = parent

    def _global(self, c: Collective) -> Collective:
        """``c`` with its straggler and missing ranks as global ranks (unchanged where unknown)."""
        ranks = self.comm_ranks.get(c.comm)
        if not ranks:
            return c

        def g(rs: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(ranks.get(r, r) for r in rs)

        return replace(c, straggler_rank=None if c.straggler_rank is None else ranks.get(c.straggler_rank,
                                                                                         c.straggler_rank),
                       missing_ranks=g(c.missing_ranks),
                       desyncs=tuple(replace(d, missing_ranks=g(d.missing_ranks)) for d in c.desyncs))


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
                      desyncs=_desyncs(span, op, seq), figures=tuple(straggler_figures(a)),
                      comm=str(a["nccl.comm.id"]), nranks=a.get("nccl.nranks"))


def _p2p(a: dict[str, Any]) -> Collective:
    """A grouped send/recv instance (no sequence number: seq -1; no straggler)."""
    return Collective(op=P2P_OP, seq=-1, arrived=int(a.get("nccl.group.nranks", 0)),
                      partial=bool(a.get("nccl.partial")), missing_ranks=(), skew_ns=a.get("nccl.skew_ns"),
                      straggler_rank=None, straggler_host=None, comm=str(a.get("nccl.comm.id", "")),
                      nranks=a.get("nccl.group.nranks"))


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
            summary._note(resource, a)
            if "nccl.rank" in a and "nccl.seq" in a and "host.name" in resource:
                summary.rank_hosts[int(resource.get("ml.rank", a["nccl.rank"]))] = str(resource["host.name"])
            elif not span.get("parentSpanId"):
                try:
                    if "nccl.comm.id" in a and "nccl.seq" in a and "nccl.ranks.arrived" in a:
                        summary.collectives.append(_collective(span, a))
                    elif a.get("nccl.op") == P2P_OP:
                        summary.p2p.append(_p2p(a))
                except (ValueError, TypeError, KeyError):
                    summary.bad_lines += 1
    summary.collectives = sorted((summary._global(c) for c in summary.collectives), key=lambda c: (c.seq, c.op))
    return summary


def read_comms(directory: str | Path) -> list[CommName]:
    """The groups the job named in ``directory/comms-rank<r>.json`` (train.py's record: a list of ``{"name",
    "members", ...}``), each (name, members) once, in the order first seen, files by rank. Unreadable files
    and entries are skipped; a missing directory gives []. Never raises."""
    def rank_of(path: Path) -> int:
        digits = path.stem.removeprefix("comms-rank")
        return int(digits) if digits.isdigit() else 1 << 30

    seen: dict[tuple[str, tuple[int, ...]], None] = {}
    try:
        files = sorted(Path(directory).glob("comms-rank*.json"), key=rank_of)
    except OSError:
        return []
    for path in files:
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for e in entries if isinstance(entries, list) else []:
            try:
                seen.setdefault((str(e["name"]), tuple(int(r) for r in e["members"])), None)
            except (TypeError, KeyError, ValueError):
                continue
    return [CommName(name, members) for name, members in seen]


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


def _communicators(s: Summary, names: Sequence[CommName]) -> list[str]:
    rows = s.communicators(names)
    lines = [f"communicators: {len(rows)} (ranks are global ranks; collectives joined per communicator)"]
    width = max((len(r.name) for r in rows[:MAX_COMM_LINES]), default=0)
    for r in rows[:MAX_COMM_LINES]:
        ranks = ",".join("?" if g is None else str(g) for g in r.ranks) or "?"
        ops = ", ".join(f"{op} {n}" for op, n in r.ops)
        lines.append(f"  {r.name:<{width}} ranks {ranks} (size {r.size}, comm {r.comm[:8]}): {r.complete + r.partial} "
                     f"({r.complete} complete, {r.partial} partial): {ops}")
    if len(rows) > MAX_COMM_LINES:
        lines.append(f"  ... {len(rows) - MAX_COMM_LINES} more")
    return lines


def render(s: Summary, *, straggler: int | None, killed: int | None, out_dir: str | Path,
           report: str | Path | None = None, comms: Sequence[CommName] = (), hangs: Sequence[str] = ()) -> str:
    """The demo's closing report. ``straggler``/``killed``: the injected ranks, or None.
    ``report``: the HTML report written (or a line saying why there is none). ``comms``: the job's
    names of its groups (:func:`read_comms`), for the per-communicator lines. ``hangs``: :func:`read_hangs`."""
    out = Path(out_dir)
    hosts = sorted(set(s.rank_hosts.values()))
    p2p = (f" + {len(s.p2p)} grouped send/recv ({sum(1 for c in s.p2p if not c.partial)} complete, "
           f"{sum(1 for c in s.p2p if c.partial)} partial)") if s.p2p else ""
    lines = [f"collectives joined: {len(s.collectives)} ({len(s.complete)} complete, {len(s.partial)} partial)"
             f"{p2p} from {len(s.rank_hosts)} ranks on {len(hosts)} hosts ({', '.join(hosts) or '-'})"]
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
    if s.collectives or s.p2p:
        lines += _communicators(s, comms)
    for c in s.partial[:5]:
        lines.append(f"partial: {c.op} seq {c.seq}: {c.arrived} ranks arrived, missing ranks "
                     f"{_ranks(c.missing_ranks)}")
    if len(s.partial) > 5:
        lines.append(f"partial: ... {len(s.partial) - 5} more")
    for d in s.desyncs[:5]:
        lines.append(f"desync: {d.op} seq {d.seq} waited {d.waited_ms / 1000:.1f}s for ranks {_ranks(d.missing_ranks)} "
                     f"(hosts {', '.join(d.missing_hosts) or '?'})")
    lines += list(hangs)
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
