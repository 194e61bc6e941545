"""Split communicators' ranks, resolved at the gateway from every parent rank's split span.

PyTorch makes every subgroup with ``ncclCommSplit`` and never asks NCCL the child's rank or size;
an agent that saw the split calls of all the parent's ranks computes them itself
(otel_ebpf/processors/nccl/splits.py). Otherwise, its child spans carry ``nccl.comm.id``,
``nccl.seq`` and ``nccl.parent.rank`` but no ``nccl.rank``, and its ``ncclCommSplit`` spans carry
:data:`otel_ebpf.core.ids.SPLIT_ATTRIBUTES`. Here, once every parent rank's split span of one split
(parent id, k) arrived, each color's child id (:func:`~otel_ebpf.core.ids.split_comm_id`) and its
parent rank -> (rank, nranks) map follow (:func:`~otel_ebpf.core.ids.split_ranks`, NCCL's rule).

Bounds: at most ``max_splits`` splits being collected and as many resolved children remembered
(oldest forgotten first), at most ``max_waiting`` child spans waiting for their split, each at
most ``timeout`` seconds. :meth:`SplitBook.expired` hands back the spans to pass on unresolved.

Not thread-safe: owned by the collective_join processor's single worker.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from otel_ebpf.core.ids import split_comm_id, split_ranks
from otel_ebpf.core.readable import ReadableSpan

__all__ = ["SplitBook", "split_call"]

SplitCall = tuple[str, int, int, int, int, int]  # parent id, k, parent rank, parent nranks, color, key


def split_call(attrs: Mapping[str, Any]) -> SplitCall | None:
    """The split call a ``ncclCommSplit`` span describes, or None when it lacks a field."""
    parent = attrs.get("nccl.parent.comm.id")
    ints = [attrs.get(k) for k in ("nccl.split.seq", "nccl.parent.rank", "nccl.parent.nranks",
                                   "nccl.split.color", "nccl.split.key")]
    if type(parent) is not str or any(type(v) is not int for v in ints):
        return None
    k, rank, nranks, color, key = (int(v) for v in ints)  # type: ignore[arg-type]
    if not 0 <= rank < nranks:
        return None
    return parent, k, rank, nranks, color, key


class SplitBook:
    """Split calls collected per split, resolved children, and child spans waiting (module doc)."""

    def __init__(self, max_splits: int, max_waiting: int, timeout: float) -> None:
        self.max_splits = max_splits
        self.max_waiting = max_waiting
        self.timeout = timeout
        self._calls: OrderedDict[tuple[str, int], tuple[int, dict[int, tuple[int, int]]]] = OrderedDict()
        self._children: OrderedDict[str, dict[int, tuple[int, int]]] = OrderedDict()
        self._waiting: OrderedDict[str, list[tuple[float, ReadableSpan]]] = OrderedDict()
        self.waiting = 0

    def record(self, call: SplitCall) -> list[str]:
        """One parent rank's split call; the child ids it resolved (their waiting spans: :meth:`take`)."""
        parent, k, rank, nranks, color, key = call
        entry = self._calls.get((parent, k))
        if entry is None:
            while len(self._calls) >= self.max_splits:
                self._calls.popitem(last=False)
            entry = self._calls[(parent, k)] = (nranks, {})
        entry[1][rank] = (color, key)
        if len(entry[1]) < entry[0]:
            return []
        del self._calls[(parent, k)]
        colors = {parent_rank: c for parent_rank, (c, _key) in entry[1].items()}
        resolved: dict[str, dict[int, tuple[int, int]]] = {}
        for parent_rank, ranked in split_ranks(entry[1]).items():
            resolved.setdefault(split_comm_id(parent, k, colors[parent_rank]), {})[parent_rank] = ranked
        for child, members in resolved.items():
            while len(self._children) >= self.max_splits:
                self._children.popitem(last=False)
            self._children[child] = members
        return list(resolved)

    def lookup(self, child: str, parent_rank: int) -> tuple[int, int] | None:
        """(rank, nranks) in ``child`` of the process that was ``parent_rank``, once resolved."""
        ranks = self._children.get(child)
        return None if ranks is None else ranks.get(parent_rank)

    def wait(self, child: str, span: ReadableSpan, now: float) -> None:
        """Hold a span of ``child`` until its split resolves (bounded: see :meth:`expired`)."""
        self._waiting.setdefault(child, []).append((now, span))
        self.waiting += 1

    def take(self, child: str) -> list[ReadableSpan]:
        spans = [span for _t, span in self._waiting.pop(child, [])]
        self.waiting -= len(spans)
        return spans

    def expired(self, now: float) -> list[ReadableSpan]:
        """Spans to pass on unresolved: waiting ``timeout`` or more, or beyond ``max_waiting``
        (the oldest child's first)."""
        out: list[ReadableSpan] = []
        for child in list(self._waiting):
            over = self.waiting > self.max_waiting
            spans = self._waiting[child]
            keep = [(t, s) for t, s in spans if not over and now - t < self.timeout]
            out.extend(s for t, s in spans if over or now - t >= self.timeout)
            self.waiting -= len(spans) - len(keep)
            if keep:
                self._waiting[child] = keep
            else:
                del self._waiting[child]
        return out

    def drain(self) -> list[ReadableSpan]:
        out = [span for spans in self._waiting.values() for _t, span in spans]
        self.clear()
        return out

    def clear(self) -> None:
        self._calls.clear()
        self._children.clear()
        self._waiting.clear()
        self.waiting = 0
