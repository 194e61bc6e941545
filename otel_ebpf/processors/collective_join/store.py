"""The collective join's bounded state, after the Collector's ``groupbytraceprocessor`` store.

* pending collectives, keyed by (``nccl.comm.id``, ``nccl.seq``), oldest first arrival first
  (an ``OrderedDict``: the head is always the next to time out), at most ``max_pending`` of
  them holding at most ``max_spans`` rank spans in all: beyond either, :meth:`Store.add`
  and :meth:`Store.make_room` hand back the oldest to be released early;
* the same collectives not yet checked for desync, in the same order (a second ``OrderedDict``,
  so a check is O(1) per collective however long the timeout);
* the last ``max_pending`` released keys, to recognise late spans;
* per communicator, each rank's wavefront: the highest ``nccl.seq`` it reached and the resource
  it came from, for ``max_comms`` communicators (least recently started forgotten first) and at
  most ``max_spans`` (rank, seq) entries in all.

Not thread-safe: owned by the processor, which runs on one pipeline worker.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from otel_ebpf.core.events import SpanEventRecord
from otel_ebpf.core.readable import ReadableSpan, span_times

__all__ = ["Collective", "Front", "Key", "Store"]

Key = tuple[str, int]


class Collective:
    """One pending collective: the rank spans so far (rank -> span) and their starts (rank -> epoch ns, in the same
    order), rank 0's root span if it came, what the first rank said (op, count, datatype) and what disagreed, and
    the arrivals so far (kept as each rank span is added: the release reads them without a pass over the ranks)."""

    __slots__ = ("end", "events", "first", "first_start", "key", "last", "last_rank", "mismatch", "nranks", "ranks",
                 "root", "sig", "starts", "trace_id")

    def __init__(self, key: Key, trace_id: int, nranks: int, first: float) -> None:
        self.key = key
        self.trace_id = trace_id
        self.nranks = nranks
        self.first = first  # clock() at the first arrival
        self.ranks: dict[int, ReadableSpan] = {}
        self.starts: dict[int, int] = {}
        self.first_start = self.last = self.end = 0  # set by the first add
        self.last_rank = -1
        self.root: ReadableSpan | None = None
        self.sig: tuple[Any, Any, Any] | None = None
        self.mismatch: set[str] | None = None
        self.events: list[SpanEventRecord] = []

    def add(self, rank: int, span: ReadableSpan) -> None:
        """Rank ``rank``'s span (not yet held)."""
        s, e = span_times(span)
        if not self.ranks:
            self.first_start, self.last, self.last_rank, self.end = s, s, rank, e
        else:
            if s < self.first_start:
                self.first_start = s
            if s > self.last or (s == self.last and rank > self.last_rank):
                self.last, self.last_rank = s, rank
            if e > self.end:
                self.end = e
        self.ranks[rank] = span
        self.starts[rank] = s

    def missing(self) -> list[int]:
        return [r for r in range(self.nranks) if r not in self.ranks]

    def arrivals(self) -> tuple[int, int, int, int]:
        """(first start, last start, the rank that started last (highest on ties), last end) of the rank
        spans so far (at least one); times are epoch ns."""
        assert self.ranks
        return self.first_start, self.last, self.last_rank, self.end


class Front:
    """One communicator's wavefront: rank -> highest seq seen, rank -> resource of that span."""

    __slots__ = ("resources", "seqs")

    def __init__(self) -> None:
        self.seqs: dict[int, int] = {}
        self.resources: dict[int, Any] = {}


class Store:
    """Pending collectives, released keys and wavefronts, each bounded (see module doc)."""

    def __init__(self, max_pending: int, max_spans: int, max_comms: int) -> None:
        self.max_pending = max_pending
        self.max_spans = max_spans
        self.max_comms = max_comms
        self._pending: OrderedDict[Key, Collective] = OrderedDict()
        self._unchecked: OrderedDict[Key, Collective] = OrderedDict()
        self._released: OrderedDict[Key, None] = OrderedDict()
        self._fronts: OrderedDict[str, Front] = OrderedDict()
        self._front_entries = 0
        self.spans = 0  # rank spans held by pending collectives
        self.fronts_evicted = 0

    def __len__(self) -> int:
        return len(self._pending)

    def get(self, key: Key) -> Collective | None:
        return self._pending.get(key)

    def was_released(self, key: Key) -> bool:
        return key in self._released

    def add(self, key: Key, trace_id: int, nranks: int, now: float) -> tuple[Collective, list[Collective]]:
        """A new pending collective, and the oldest ones taken out to make room (release them)."""
        evicted = []
        while len(self._pending) >= self.max_pending:
            evicted.append(self.pop(next(iter(self._pending))))
        entry = Collective(key, trace_id, nranks, now)
        self._pending[key] = entry
        self._unchecked[key] = entry
        front = self._fronts.get(key[0])
        if front is not None:
            self._fronts.move_to_end(key[0])
        return entry, evicted

    def make_room(self, keep: Collective) -> list[Collective]:
        """Take out the oldest collectives (never ``keep``) while ``max_spans`` are held."""
        evicted = []
        while self.spans >= self.max_spans:
            victim = next((k for k in self._pending if k != keep.key), None)
            if victim is None:
                break
            evicted.append(self.pop(victim))
        return evicted

    def pop(self, key: Key) -> Collective:
        """Take a collective out for release and remember its key."""
        entry = self._pending.pop(key)
        self._unchecked.pop(key, None)
        self.spans -= len(entry.ranks)
        self._released[key] = None
        if len(self._released) > self.max_pending:
            self._released.popitem(last=False)
        return entry

    def oldest(self) -> Collective | None:
        return next(iter(self._pending.values()), None)

    def oldest_unchecked(self) -> Collective | None:
        return next(iter(self._unchecked.values()), None)

    def checked(self, entry: Collective) -> None:
        self._unchecked.pop(entry.key, None)

    def pending(self) -> list[Collective]:
        return list(self._pending.values())

    # -- wavefront -------------------------------------------------------------------------
    def advance(self, comm: str, rank: int, seq: int, resource: Any) -> None:
        """Rank ``rank`` of ``comm`` reached ``seq`` (kept only when higher than before)."""
        front = self._fronts.get(comm)
        old = None if front is None else front.seqs.get(rank)
        if old is None:
            while self._front_entries >= self.max_spans and self._fronts:
                self._drop_front()  # may be this communicator's own: it starts again
            front = self._fronts.get(comm)
            if front is None:
                while len(self._fronts) >= self.max_comms:
                    self._drop_front()
                front = self._fronts[comm] = Front()
            self._front_entries += 1
        elif old >= seq:
            return
        assert front is not None
        front.seqs[rank] = seq
        front.resources[rank] = resource

    def _drop_front(self) -> None:
        _comm, front = self._fronts.popitem(last=False)
        self._front_entries -= len(front.seqs)
        self.fronts_evicted += 1

    def front(self, comm: str) -> Front | None:
        return self._fronts.get(comm)

    def clear(self) -> None:
        self._pending.clear()
        self._unchecked.clear()
        self._released.clear()
        self._fronts.clear()
        self._front_entries = self.spans = 0
