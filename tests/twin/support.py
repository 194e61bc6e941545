"""The twin's traced runs, read back, for the twin's tests: ``otel-ebpf run`` around torchrun on one host
(:func:`traced_run`); what the ranks wrote of torch's own view of their groups (:func:`rank_records`,
:func:`torch_groups`); and a gateway's output (``otel_ebpf.twin.cluster.run_cluster``) checked against it
(:func:`gateway_view` and the ``*_problems`` functions, :func:`counters`, :func:`joined_numbers`)."""
from __future__ import annotations

import fcntl
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_ebpf.twin import TwinEnv
from otel_ebpf.twin.launch import twin_environment

__all__ = [
    "GatewayView",
    "Group",
    "Instance",
    "P2p",
    "counters",
    "gateway_view",
    "joined_numbers",
    "kill_problems",
    "membership_problems",
    "p2p_problems",
    "rank_records",
    "slot_cleaned",
    "straggler_problems",
    "torch_groups",
    "traced_run",
]

Group = dict[int, tuple[int, int]]  # global rank -> (rank in the group, group size)


def _torchrun(twin: TwinEnv, nproc: int, script: Path, args: Sequence[str]) -> list[str]:
    return [str(twin.python), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            str(script), *args]


def traced_run(twin: TwinEnv, libdir: Path, script: Path, nproc: int, out: Path,
               agent_out: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``otel-ebpf run`` around torchrun on the twin's libraries (the environment otel_ebpf.twin.launch gives)."""
    rendezvous = Path(tempfile.mkdtemp(prefix="otel-ebpf-twin-"))
    try:
        cmd = [sys.executable, "-m", "otel_ebpf", "run", "--output", str(agent_out), "--",
               *_torchrun(twin, nproc, script, [str(out)])]
        env = {**twin_environment(libdir, nproc, rendezvous), **(extra_env or {})}
        return subprocess.run(cmd, env=env, capture_output=True,
                              text=True, timeout=400)
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)


def rank_records(out: Path, nranks: int) -> list[dict[str, Any]]:
    """What each rank of a workload program wrote (tests/twin/programs/wl_common.py, traced_groups.py)."""
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nranks)]


def torch_groups(views: Sequence[Mapping[str, Any]]) -> list[Group]:
    """Each distinct group torch used, as global rank -> (its rank, its size), from the ranks' records."""
    groups: dict[tuple[str, tuple[int, ...]], Group] = {}
    for v in views:
        for g in v["groups"]:
            groups.setdefault((g["name"], tuple(g["members"])), {})[v["rank"]] = (g["rank"], g["size"])
    return list(groups.values())


# ---- the gateway's output, checked against torch's view ----------------------------------------------------
Signature = frozenset[tuple[int, int, int]]  # {(global rank, rank in the communicator, its size)}
_NOT_COLLECTIVE = ("ncclSend", "ncclRecv", "ncclGroup")


def _signature(group: Group) -> Signature:
    return frozenset((g, r, n) for g, (r, n) in group.items())


@dataclass(frozen=True)
class P2p:
    """One ncclSend/ncclRecv span: the global rank that made it (-1: no rank's process), its name, attributes
    and start (epoch ns)."""

    rank: int
    name: str
    attrs: dict[str, Any]
    start: int


@dataclass
class Instance:
    """One trace of one collective at the gateway: its rank spans by global rank and its root(s)."""

    comm: str
    seq: int
    ranks: dict[int, tuple[int, int]]  # global rank -> (nccl.rank, nccl.nranks)
    starts: dict[int, int]  # global rank -> its span's start (epoch ns)
    roots: list[dict[str, Any]]  # the root spans' attributes (exactly one when joined)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # the roots' (name, attributes)
    duplicates: int = 0

    @property
    def complete(self) -> bool:
        sizes = {n for _r, n in self.ranks.values()}
        return (len(self.roots) == 1 and not self.roots[0].get("nccl.partial") and not self.duplicates
                and len(sizes) == 1 and len(self.ranks) == sizes.pop())


@dataclass
class GatewayView:
    """The gateway's spans read against the ranks' records (wl_common.py): which global rank sent each span
    (by host name and pid), every collective instance, the send/recv pairs, and what does not fit."""

    records: Sequence[Mapping[str, Any]]
    instances: dict[bytes, Instance]  # trace id -> instance
    p2p: dict[bytes, list[P2p]]  # trace id -> its send/recv spans
    p2p_roots: dict[bytes, list[dict[str, Any]]]  # trace id -> its "nccl GroupP2P" roots' attributes
    unranked: list[dict[str, Any]]  # collective spans without nccl.rank
    orphans: list[str]  # spans whose parent is not in their trace
    # GPU spans (nccl.timing = "gpu", the NCCL profiler plugin's, children of host spans; those from the plugin
    # alone, nccl.source = "profiler_plugin", are rank spans): trace id -> (name, global rank or -1, attributes)
    gpu: dict[bytes, list[tuple[str, int, dict[str, Any]]]] = field(default_factory=dict)

    def phase_of(self, rank: int, start_ns: int) -> str:
        """The phase (wl_common.Job.phase) whose window on ``rank`` holds ``start_ns`` (a window the rank never
        closed is open-ended); "" outside all."""
        for name, (lo, hi) in self.records[rank]["phases"].items():
            if lo <= start_ns and (hi is None or start_ns <= hi):
                return str(name)
        return ""

    def instance_phase(self, inst: Instance) -> str:
        rank = min(inst.starts)
        return self.phase_of(rank, inst.starts[rank])


def gateway_view(traces: Path, records: Sequence[Mapping[str, Any]]) -> GatewayView:
    """Reads the gateway's traces.jsonl; spans of processes that are no rank (the agent's own) are ignored."""
    from tests.support.otlp_sink import decode_attrs, spans_from_jsonl

    rank_of = {(str(r["host"]), int(r["pid"])): int(r["rank"]) for r in records}
    rows = spans_from_jsonl(traces)
    ids = {(s.trace_id, s.span_id) for _res, _scope, s in rows}
    view = GatewayView(records, {}, {}, {}, [], [])
    for res, _scope, span in rows:
        if span.parent_span_id and (span.trace_id, span.parent_span_id) not in ids:
            view.orphans.append(f"{span.name} trace {span.trace_id.hex()}")
        attrs = decode_attrs(span.attributes)
        if span.name == "nccl GroupP2P":
            view.p2p_roots.setdefault(span.trace_id, []).append(attrs)
            continue
        comm, seq = attrs.get("nccl.comm.id"), attrs.get("nccl.seq")
        if not isinstance(comm, str) or not isinstance(seq, int) or span.name.startswith("ncclComm"):
            continue
        rank = rank_of.get((str(res.get("host.name")), int(res.get("process.pid", -1))))
        if attrs.get("nccl.timing") == "gpu" and attrs.get("nccl.source") != "profiler_plugin":
            view.gpu.setdefault(span.trace_id, []).append((span.name, -1 if rank is None else rank, attrs))
            continue
        if span.name in ("ncclSend", "ncclRecv"):
            view.p2p.setdefault(span.trace_id, []).append(
                P2p(-1 if rank is None else rank, span.name, attrs, int(span.start_time_unix_nano)))
            continue
        if span.name in _NOT_COLLECTIVE:
            continue
        inst = view.instances.setdefault(span.trace_id, Instance(comm, seq, {}, {}, []))
        if not span.parent_span_id and "nccl.rank" not in attrs:
            inst.roots.append(attrs)
            inst.events += [(e.name, decode_attrs(e.attributes)) for e in span.events]
        elif "nccl.rank" not in attrs or rank is None:
            view.unranked.append({"span": span.name, "rank": rank, **attrs})
        elif rank in inst.ranks:
            inst.duplicates += 1
        else:
            inst.ranks[rank] = (int(attrs["nccl.rank"]), int(attrs["nccl.nranks"]))
            inst.starts[rank] = int(span.start_time_unix_nano)
    return view


def gpu_problems(view: GatewayView) -> list[str]:
    """GPU time (the NCCL profiler plugin, issue 16): every complete collective instance has, from each of its
    ranks, a GPU span with NCCL's algorithm, protocol and a positive duration inside the instance's trace, and
    one joined ``nccl <Op> gpu`` span naming all of them as arrived."""
    problems = []
    for trace, inst in view.instances.items():
        if not inst.complete:
            continue
        spans = view.gpu.get(trace, [])
        ranked = {r: a for name, r, a in spans if "nccl.rank" in a and not name.startswith("nccl ")}
        joined = [a for name, _r, a in spans if name.startswith("nccl ") and name.endswith(" gpu")]
        where = f"comm {inst.comm} seq {inst.seq} ({(inst.roots or [{}])[0].get('nccl.op')})"
        if set(ranked) != set(inst.ranks):
            problems.append(f"{where}: GPU spans of ranks {sorted(ranked)}, host spans of {sorted(inst.ranks)}")
        bad = [r for r, a in ranked.items() if not (a.get("nccl.algo") and a.get("nccl.proto")
                                                    and int(a.get("nccl.gpu.duration_ns", 0)) > 0)]
        if bad:
            problems.append(f"{where}: GPU spans without algo/proto/duration from ranks {bad}")
        if len(joined) != 1 or joined[0].get("nccl.gpu.ranks.arrived") != len(inst.ranks):
            problems.append(f"{where}: joined GPU spans {[(a.get('nccl.gpu.ranks.arrived')) for a in joined]}")
    return problems


def membership_problems(view: GatewayView) -> list[str]:
    """Each collective instance: one joined trace holding exactly the ranks of a group torch made, each with
    torch's rank and size in it; every group torch used has instances; no span unranked or orphaned."""
    expected = {_signature(g) for g in torch_groups(view.records)}
    problems = [f"unranked collective span: {u}" for u in view.unranked[:5]]
    problems += [f"parent not in its trace: {o}" for o in view.orphans[:5]]
    seen: set[Signature] = set()
    for inst in view.instances.values():
        sig = frozenset((g, r, n) for g, (r, n) in inst.ranks.items())
        seen.add(sig)
        if not inst.complete or sig not in expected:
            root = inst.roots[0] if inst.roots else {}
            problems.append(f"comm {inst.comm} seq {inst.seq} ({root.get('nccl.op')}): "
                            f"ranks {sorted(inst.ranks.items())}"
                            f", {len(inst.roots)} roots, partial {root.get('nccl.partial')}, "
                            f"missing {root.get('nccl.missing_ranks')}, {inst.duplicates} duplicates")
    problems += [f"torch group never seen at the gateway: {sorted(s)}" for s in expected - seen]
    return problems


def p2p_problems(view: GatewayView, expected: Mapping[str, Sequence[set[int]]]) -> list[str]:
    """Grouped send/recv (one torch collective: all-to-all, scatter, a pipeline stage's batch): each instance
    one trace under one complete ``nccl GroupP2P`` root, every send matched by its recv, the root's
    ``nccl.group.ranks`` the ranks of its spans, and those (global) ranks one of ``expected[phase]``."""
    problems = []
    for trace, spans in view.p2p.items():
        roots = view.p2p_roots.get(trace, [])
        ranks = {p.rank for p in spans}
        phase = _p2p_phase(view, spans)
        comm_ranks = sorted({p.attrs.get("nccl.rank", -1) for p in spans})  # -1: a span left unranked
        if len(roots) != 1 or roots[0].get("nccl.partial") or not _paired(spans) or \
                roots[0].get("nccl.group.ranks") != comm_ranks or ranks not in expected.get(phase, ()):
            root = roots[0] if roots else {}
            calls = sorted((p.rank, p.name, p.attrs.get("nccl.rank"), p.attrs.get("nccl.peer")) for p in spans)
            problems.append(f"p2p trace {trace.hex()} ({phase}): {len(roots)} roots, partial "
                            f"{root.get('nccl.partial')}, group.ranks {root.get('nccl.group.ranks')}, calls {calls}")
    return problems


def straggler_problems(view: GatewayView, straggler: int, marker: int, expected: int) -> list[str]:
    """The step markers (wl_common.Job.step: world all-reduces of ``marker`` elements, ``expected`` of them):
    each joined, and its root names the rank that slept before it as the straggler."""
    world = _signature({r["rank"]: (r["rank"], len(view.records)) for r in view.records})
    markers = [i for i in view.instances.values() if i.roots and i.roots[0].get("nccl.op") == "AllReduce"
               and i.roots[0].get("nccl.count") == marker and frozenset(
                   (g, r, n) for g, (r, n) in i.ranks.items()) == world]
    problems = [] if len(markers) == expected else [f"{len(markers)} step markers joined, {expected} made"]
    for inst in markers:
        named = inst.roots[0].get("nccl.straggler.rank")
        if named != straggler:  # on the world communicator, the straggler's rank is its global rank
            problems.append(f"marker seq {inst.seq}: straggler {named}, skew {inst.roots[0].get('nccl.skew_ns')}"
                            f" ns, not rank {straggler}")
    return problems


def kill_problems(view: GatewayView, killed: int, marker: int) -> list[str]:
    """A rank killed before a step's marker (wl_common.Job.step): that marker is released partial with exactly
    the killed rank missing, and its root carries a ``nccl.desync`` event naming it."""
    world = len(view.records)
    markers = [i for i in view.instances.values() if i.roots and i.roots[0].get("nccl.op") == "AllReduce"
               and i.roots[0].get("nccl.count") == marker and i.roots[0].get("nccl.nranks") == world]
    partial = [i for i in markers if i.roots[0].get("nccl.partial")]
    if len(partial) != 1:
        return [f"{len(partial)} partial step markers, not 1: "
                f"{[(i.seq, sorted(i.ranks), i.roots[0].get('nccl.missing_ranks')) for i in markers]}"]
    inst = partial[0]
    problems = []
    survivors = sorted(set(range(world)) - {killed})
    if inst.roots[0].get("nccl.missing_ranks") != [killed] or sorted(inst.ranks) != survivors:
        problems.append(f"marker seq {inst.seq}: ranks {sorted(inst.ranks)}, missing "
                        f"{inst.roots[0].get('nccl.missing_ranks')}, not rank {killed}")
    desyncs = [a for name, a in inst.events if name == "nccl.desync"]
    if not desyncs or any(a.get("nccl.missing_ranks") != [killed] for a in desyncs):
        problems.append(f"marker seq {inst.seq}: desync events {desyncs}, none naming only rank {killed}")
    return problems


def counters(metrics: Path, name: str) -> dict[str, int]:
    """{reason: total} of a cumulative counter with a ``reason`` attribute, summed over the resources that
    sent it (each agent's last value); empty when nothing was ever counted (the counter is created at its
    first increment)."""
    from tests.support.otlp_sink import decode_attrs, metrics_from_jsonl

    last: dict[tuple[str, str], int] = {}
    for res, metric in metrics_from_jsonl(metrics):
        if metric.name != name:
            continue
        who = json.dumps(res, sort_keys=True, default=str)
        for point in metric.sum.data_points:
            reason = str(decode_attrs(point.attributes).get("reason"))
            last[(who, reason)] = max(last.get((who, reason), 0), point.as_int)
    totals: dict[str, int] = {}
    for (_who, reason), value in last.items():
        totals[reason] = totals.get(reason, 0) + value
    return totals


def joined_numbers(view: GatewayView) -> dict[str, tuple[int, int, int, int]]:
    """Per phase: (collective instances joined, collectives seen, grouped send/recv instances joined, seen).
    A collective is seen once per trace, plus once per unranked span; a send/recv instance once per trace."""
    out: dict[str, list[int]] = {}
    for inst in view.instances.values():
        row = out.setdefault(view.instance_phase(inst) if inst.starts else "", [0, 0, 0, 0])
        row[0] += inst.complete
        row[1] += 1
    if view.unranked:
        out.setdefault("?", [0, 0, 0, 0])[1] += len(view.unranked)
    for trace, spans in view.p2p.items():
        roots = view.p2p_roots.get(trace, [])
        row = out.setdefault(_p2p_phase(view, spans), [0, 0, 0, 0])
        row[2] += len(roots) == 1 and not roots[0].get("nccl.partial") and _paired(spans)
        row[3] += 1
    return {k: (v[0], v[1], v[2], v[3]) for k, v in out.items()}


def _paired(spans: Sequence[P2p]) -> bool:
    """Every send has its recv: the same (comm, src, dst, k, count) seen from both ends."""
    ends: dict[str, list[tuple[object, ...]]] = {"ncclSend": [], "ncclRecv": []}
    for p in spans:
        rank, peer = p.attrs.get("nccl.rank"), p.attrs.get("nccl.peer")
        src, dst = (rank, peer) if p.name == "ncclSend" else (peer, rank)
        ends[p.name].append((p.attrs.get("nccl.comm.id"), src, dst, p.attrs.get("nccl.seq"), p.attrs.get("nccl.count")))
    return sorted(ends["ncclSend"]) == sorted(ends["ncclRecv"])


def _p2p_phase(view: GatewayView, spans: Sequence[P2p]) -> str:
    first = min(spans, key=lambda p: p.start)
    return "?" if first.rank < 0 else view.phase_of(first.rank, first.start)


def slot_cleaned(said: str) -> bool:
    """Nothing left behind by the cluster run that printed ``said``: no namespace or root-side veth of its node
    slot (read from the gateway's address, 10.213.(128 + slot).1). Another run may hold the slot by now (runs of
    other tests or users coexist): then its namespaces are that run's and nothing can be said."""
    m = re.search(r"gateway listening on 10\.213\.(\d+)\.1:", said)
    assert m, said
    slot = int(m.group(1)) - 128
    with open(f"/run/otel-ebpf/nodes-{slot}.lock", "wb") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True  # in use by a newer run
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10).stdout
        return f"oe-twin-{slot}-" not in listing and not re.search(rf"^\d+:\s+oe{slot}h\b", links, re.M)
