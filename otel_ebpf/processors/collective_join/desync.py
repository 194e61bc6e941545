"""Desync reports of the collective join: a collective that has waited ``desync_timeout`` with ranks missing
gets, at once, a ``nccl.desync`` event for its root span, a ``nccl.desync.count`` increment and a warning naming
the missing ranks, their hosts and each rank's last seq (at most one warning per communicator per
``desync_timeout``; the rest are counted in the next). Single-threaded (the join's)."""
from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from otel_ebpf.core.events import SpanEventRecord

from .hangs import HangStacks
from .metrics import ranges_text
from .store import Collective, Front, Store

__all__ = ["DesyncReports", "host_of"]

log = logging.getLogger(__name__)


class DesyncReports:
    """``count(comm, op)`` adds one to ``nccl.desync.count``; ``wall_ns`` stamps the events."""

    def __init__(self, store: Store, desync: float, max_comms: int, wall_ns: Callable[[], int],
                 count: Callable[[str, str], None], hangs: HangStacks) -> None:
        self._store, self._desync, self._max_comms = store, desync, max_comms
        self._wall_ns, self._count, self._hangs = wall_ns, count, hangs
        self._warned: OrderedDict[str, list[Any]] = OrderedDict()  # comm -> [last warning, left out since]

    def report(self, entry: Collective, now: float, out: list[object]) -> None:
        """The report of ``entry``'s hang: its span event, count and warning here, its log record (with the
        missing ranks' stacks: :mod:`.hangs`) into ``out``."""
        comm, seq = entry.key
        missing = entry.missing()
        front = self._store.front(comm)
        seqs = front.seqs if front else {}
        last = tuple(seqs.get(r, -1) for r in range(entry.nranks))
        hosts = sorted({str(h) for h in (host_of(front, r) for r in missing) if h is not None})
        op = entry.sig[0] if entry.sig else None
        waited = int((now - entry.first) * 1e9)
        stacks, where = self._hangs.desync(comm, seq, str(op), missing, sorted(entry.ranks), hosts, entry.trace_id,
                                           waited, now, out)
        entry.events.append(SpanEventRecord("nccl.desync", self._wall_ns(), {
            "nccl.missing_ranks": tuple(missing), "nccl.missing.hosts": tuple(hosts), "nccl.last_seq": last,
            "nccl.waited_ns": waited, **stacks}))
        self._count(comm, str(op))
        if self._quiet(comm, now):
            return
        by_seq: dict[int, list[int]] = {}
        for r, s in enumerate(last):
            by_seq.setdefault(s, []).append(r)
        fronts = "; ".join(f"{'never' if s < 0 else s}: ranks {ranges_text(rs)}"
                           for s, rs in sorted(by_seq.items(), reverse=True)[:16])
        quieted = self._warned[comm][1]
        self._warned[comm][1] = 0
        log.warning("NCCL desync: comm %s seq %d (%s) has waited %.1fs for ranks %s of %d (hosts: %s); "
                    "last seq per rank: %s%s%s", comm, seq, op, now - entry.first, ranges_text(missing), entry.nranks,
                    ", ".join(hosts[:16]) or "unknown", fronts, where,
                    f" ({quieted} more hung collectives of this communicator not logged)" if quieted else "")

    def _quiet(self, comm: str, now: float) -> bool:
        """One warning per communicator per desync_timeout (a hang stalls every later collective
        too); True when this one is to be left out (counted, and said in the next warning)."""
        seen = self._warned.get(comm)
        if seen is not None and now - seen[0] < self._desync:
            seen[1] += 1
            return True
        if seen is None:
            while len(self._warned) >= self._max_comms:
                self._warned.popitem(last=False)
            seen = self._warned[comm] = [now, 0]
        seen[0] = now
        return False


def host_of(front: Front | None, rank: int) -> Any:
    """host.name of the resource a rank's last span came from, or None."""
    resource = front.resources.get(rank) if front is not None else None
    return resource.attributes.get("host.name") if resource is not None else None
