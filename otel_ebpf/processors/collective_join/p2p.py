"""Grouped send/recv joined as one instance: the torch collectives NCCL has no single call for.

PyTorch 2.11 issues uneven ``all_to_all_single`` (MoE), ``gather``, ``scatter`` and ``batch_isend_irecv``
as one ncclGroupStart..ncclGroupEnd of ncclSend/ncclRecv per rank on one communicator (and even a blocking
``send``/``recv`` as a group of one); NCCL 2.28.9 matches them pairwise only: send #k from A to B with
recv #k at B from A (src/enqueue.cc p2pTaskAppend). No rank knows the others' groups, so the agents give
each pair its own trace (otel_ebpf/processors/nccl/comms.py ``p2p_ids``) and the instance is found here:
the connected component of

* nodes: one rank's group (``nccl.group.id`` of its spans; a send/recv outside any group is a node alone),
* edges: (comm id, src rank, dst rank, k), seen once from the send and once from the recv.

An instance is complete when every edge has both ends and every group's ``ncclGroup`` span came with as
many send/recv spans as its ``nccl.group.p2p``. Then (or ``timeout`` seconds after its first span, as
partial, or pushed out by the bounds, as evicted) it is released as ONE trace: a root span ``nccl
GroupP2P`` (gateway resource) with ``nccl.comm.id``, ``nccl.group.ranks`` (the ranks involved, sorted),
``nccl.group.nranks``, ``nccl.bytes`` (sent), ``nccl.p2p.sends``, ``nccl.skew_ns`` (first to last rank's
first start) and, when partial, ``nccl.partial=true``, ``nccl.p2p.unmatched`` (edges with one end) and
``nccl.group.incomplete`` (groups missing spans); each rank's ``ncclGroup`` span under the root, its
members under it (a member without its group span: under the root). Span ids are kept; links between the
instance's spans follow them into the new trace. The trace and root ids derive from the instance's
smallest edge, so they are the same wherever it is joined.

A blocking send/recv pair is an instance of its two ranks. Groups that also hold collectives: those are
joined by (comm, seq) as any collective; the group's send/recv and its ``ncclGroup`` span form the p2p
instance. Simulated and captured spans (``nccl.simulated``, ``nccl.captured``) never come here.

Bounds: at most ``max_pending`` instances and ``max_spans`` spans held; beyond either the oldest is
released early (evicted). The last ``max_pending`` released nodes are remembered: a span of one passes
through unchanged (late). Sharding the gateway by trace id does NOT keep an instance together (its pairs
have different trace ids): the p2p join needs every p2p span of a communicator at one gateway.

Not thread-safe: owned by the collective_join processor's single worker.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.trace import Link, SpanContext, TraceFlags

from otel_ebpf.core.ids import derive_id
from otel_ebpf.core.readable import ReadableSpan, SpanMaker

__all__ = ["P2PJoin", "is_p2p"]

Edge = tuple[str, int, int, int]  # comm id, src rank, dst rank, k
Node = tuple[str, str]  # ("g", group id) or ("s", span id hex): one rank's group, or one ungrouped call
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def is_p2p(span: ReadableSpan, attrs: Mapping[str, Any]) -> bool:
    """True for what this join takes: a ranked, numbered send/recv, or a group span with send/recv."""
    if attrs.get("nccl.simulated") or attrs.get("nccl.captured"):
        return False
    if span.name == "ncclGroup":
        return type(attrs.get("nccl.group.id")) is str and _int(attrs.get("nccl.group.p2p")) > 0
    return (span.name in ("ncclSend", "ncclRecv") and type(attrs.get("nccl.comm.id")) is str
            and all(type(attrs.get(k)) is int for k in ("nccl.rank", "nccl.peer", "nccl.seq")))


def _int(value: Any) -> int:
    return value if type(value) is int else 0


class _Instance:
    """One component so far: its nodes, spans, group spans, edges (and those with one end)."""

    __slots__ = ("edges", "expect", "first", "got", "groups", "nodes", "open", "spans")

    def __init__(self, first: float) -> None:
        self.first = first
        self.nodes: set[Node] = set()
        self.spans: list[tuple[Node, ReadableSpan]] = []
        self.groups: dict[Node, ReadableSpan] = {}
        self.expect: dict[Node, int] = {}
        self.got: dict[Node, int] = {}
        self.edges: set[Edge] = set()
        self.open: set[Edge] = set()

    def complete(self) -> bool:
        return not self.open and all(self.got.get(n, 0) >= self.expect.get(n, 1 << 62) for n in self.nodes)

    def size(self) -> int:
        return len(self.spans) + len(self.groups)


class P2PJoin:
    """The grouped-p2p join (module doc). ``count(outcome)`` is called once per released instance."""

    def __init__(self, max_pending: int, max_spans: int, timeout: float, maker: SpanMaker,
                 count: Callable[[str], None], late: Callable[[], None]) -> None:
        self.max_pending, self.max_spans, self.timeout = max_pending, max_spans, timeout
        self._maker, self._count, self._late = maker, count, late
        self._of: dict[Node, _Instance] = {}
        self._pending: OrderedDict[int, _Instance] = OrderedDict()  # id() -> instance, oldest first
        self._ends: dict[Edge, Node] = {}  # edges seen from one end: the node of that end
        self._released: OrderedDict[Node, None] = OrderedDict()
        self.spans = 0

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, span: ReadableSpan, attrs: Mapping[str, Any], now: float, out: list[object]) -> None:
        """Take one span :func:`is_p2p` accepted; what it completes or pushes out goes to ``out``."""
        group = attrs.get("nccl.group.id")
        node: Node = ("g", group) if type(group) is str else ("s", format(span.context.span_id, "016x"))
        if node in self._released:
            self._late()
            out.append(span)
            return
        inst = self._of.get(node) or self._new(node, now, out)
        if span.name == "ncclGroup":
            inst.groups[node] = span
            inst.expect[node] = _int(attrs.get("nccl.group.p2p"))
        else:
            inst.spans.append((node, span))
            inst.got[node] = inst.got.get(node, 0) + 1
            if node[0] == "s":
                inst.expect[node] = 1
            inst = self._edge(inst, node, attrs)
        self.spans += 1
        if inst.complete():
            self._release(inst, "complete", out)
        else:
            self._make_room(inst, out)

    def _new(self, node: Node, now: float, out: list[object]) -> _Instance:
        while len(self._pending) >= self.max_pending:
            self._release(next(iter(self._pending.values())), "evicted", out)
        inst = _Instance(now)
        inst.nodes.add(node)
        self._of[node] = inst
        self._pending[id(inst)] = inst
        return inst

    def _edge(self, inst: _Instance, node: Node, attrs: Mapping[str, Any]) -> _Instance:
        rank, peer, k = attrs["nccl.rank"], attrs["nccl.peer"], attrs["nccl.seq"]
        src, dst = (rank, peer) if attrs.get("nccl.op") == "Send" else (peer, rank)
        edge: Edge = (attrs["nccl.comm.id"], src, dst, k)
        inst.edges.add(edge)
        other = self._ends.pop(edge, None)
        if other is None:
            self._ends[edge] = node
            inst.open.add(edge)
            return inst
        into = self._of.get(other)
        if into is None or into is inst:
            inst.open.discard(edge)
            return inst
        into.open.discard(edge)
        return self._merge(inst, into)

    def _merge(self, a: _Instance, b: _Instance) -> _Instance:
        """One instance of both; the older one survives, so the pending order stays by first arrival."""
        old, new = (a, b) if a.first <= b.first else (b, a)
        for node in new.nodes:
            self._of[node] = old
        old.nodes |= new.nodes
        old.spans += new.spans
        old.groups.update(new.groups)
        old.expect.update(new.expect)
        for node, n in new.got.items():
            old.got[node] = old.got.get(node, 0) + n
        old.edges |= new.edges
        old.open |= new.open
        del self._pending[id(new)]
        return old

    def _make_room(self, keep: _Instance, out: list[object]) -> None:
        while self.spans > self.max_spans:
            victim = next((i for i in self._pending.values() if i is not keep), None)
            if victim is None:
                return
            self._release(victim, "evicted", out)

    def expired(self, now: float, out: list[object]) -> None:
        """Release, as partial, the instances waiting ``timeout`` or more."""
        while self._pending:
            inst = next(iter(self._pending.values()))
            if now - inst.first < self.timeout:
                return
            self._release(inst, "partial", out)

    def drain(self, out: list[object]) -> None:
        """Release everything pending, as partial (shutdown)."""
        while self._pending:
            self._release(next(iter(self._pending.values())), "partial", out)

    def clear(self) -> None:
        self._of.clear()
        self._pending.clear()
        self._ends.clear()
        self._released.clear()
        self.spans = 0

    # ---- release ---------------------------------------------------------------------
    def _release(self, inst: _Instance, outcome: str, out: list[object]) -> None:
        del self._pending[id(inst)]
        self.spans -= inst.size()
        for node in inst.nodes:
            self._of.pop(node, None)
            self._released[node] = None
        while len(self._released) > self.max_pending:
            self._released.popitem(last=False)
        for edge in inst.open:
            self._ends.pop(edge, None)
        self._count(outcome)
        out.extend(self._spans_of(inst, outcome))

    def _spans_of(self, inst: _Instance, outcome: str) -> list[ReadableSpan]:
        first = min(inst.edges) if inst.edges else ("", 0, 0, 0)
        trace = derive_id("nccl.p2p.group", *first)
        root = derive_id("nccl.p2p.group", *first, "root", bits=64)
        moved = {s.context.span_id for _n, s in inst.spans} | {s.context.span_id for s in inst.groups.values()}
        spans: list[ReadableSpan] = [_moved(g, trace, root, moved) for g in inst.groups.values()]
        for node, span in inst.spans:
            group = inst.groups.get(node)
            spans.append(_moved(span, trace, group.context.span_id if group is not None else root, moved))
        spans.append(self._root(inst, outcome, trace, root))
        return spans

    def _root(self, inst: _Instance, outcome: str, trace: int, root: int) -> ReadableSpan:
        starts: dict[int, int] = {}
        ranks: set[int] = set()
        comms: set[str] = set()
        sent = sends = 0
        end = 0
        for _node, span in inst.spans:
            own: Mapping[str, Any] = span.attributes or {}
            rank = own["nccl.rank"]
            ranks.add(rank)
            comms.add(own["nccl.comm.id"])
            starts[rank] = min(starts.get(rank, span.start_time or 0), span.start_time or 0)
            end = max(end, span.end_time or 0)
            if span.name == "ncclSend":
                sends += 1
                sent += _int(own.get("nccl.bytes"))
        for group in inst.groups.values():
            end = max(end, group.end_time or 0)
        start = min([*starts.values(), *(g.start_time or 0 for g in inst.groups.values())], default=0)
        attrs: dict[str, Any] = {
            "nccl.op": "GroupP2P", "nccl.comm.id": ",".join(sorted(comms)), "nccl.group.ranks": tuple(sorted(ranks)),
            "nccl.group.nranks": len(ranks), "nccl.bytes": sent, "nccl.p2p.sends": sends,
            "nccl.skew_ns": (max(starts.values()) - min(starts.values())) if starts else 0,
            "nccl.timing": "host_enqueue"}
        if outcome != "complete":
            attrs["nccl.partial"] = True
            attrs["nccl.p2p.unmatched"] = len(inst.open)
            attrs["nccl.group.incomplete"] = sum(
                1 for n in inst.nodes if inst.got.get(n, 0) < inst.expect.get(n, 1 << 62))
        return self._maker.make("nccl GroupP2P", trace_id=trace, span_id=root, parent_span_id=None,
                                start_ns=start, end_ns=end, attributes=attrs)


def _moved(span: ReadableSpan, trace: int, parent: int, moved: set[int]) -> ReadableSpan:
    """``span`` in trace ``trace`` under ``parent``, same span id; its links to the other moved spans
    follow them (the others are kept as they were)."""
    links = [Link(SpanContext(trace, lk.context.span_id, is_remote=True, trace_flags=_SAMPLED), lk.attributes)
             if lk.context.span_id in moved else lk for lk in span.links]
    return ReadableSpan(
        span.name, context=SpanContext(trace, span.context.span_id, is_remote=False, trace_flags=_SAMPLED),
        parent=SpanContext(trace, parent, is_remote=True, trace_flags=_SAMPLED), resource=span.resource,
        attributes=dict(span.attributes or {}), events=span.events, links=links, kind=span.kind,
        status=span.status, start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope)
