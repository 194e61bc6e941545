"""What a desync's missing ranks are doing: the agents' silent-rank stacks (core.rankstack) joined to the
collective join's desync reports (:mod:`.desync`).

Agents send, for a rank silent in NCCL, an ``otel_ebpf.nccl.rank.stack`` log record per communicator it used,
with its last seq there. :class:`HangStacks` keeps the latest per (communicator, rank) and answers, for a
desync, "what is each missing rank doing": a record counts for a missing rank only while it still describes
it, i.e. its ``nccl.seq`` is that rank's highest seq the join has seen on the communicator (the rank has made no
call since the capture), and it is at most ``max_age`` seconds old.

Each desync report then also goes out as ONE gateway log record, ``otel_ebpf.nccl.desync`` (WARN, the gateway's
resource, the stuck collective's trace id), whose body answers the 3 a.m. question::

    NCCL desync: comm 5f..., seq 3 (AllReduce) has waited 12.0 s for rank 2 of 4; ranks 0,1,3 wait in it.
    rank 2 (host node-1, pid 4242): silent 18.0 s after seq 2, in stuck_in_dataloader_fetch (train.py:14)
    <its stack>

Attributes: ``nccl.comm.id``, ``nccl.seq``, ``nccl.op``, ``nccl.missing_ranks``, ``nccl.missing.hosts``,
``nccl.waited_ns``, ``nccl.waiting_ranks``, and per missing rank with a stack (same order)
``nccl.missing.stack_ranks``, ``nccl.missing.functions`` ("function (file:line)"), ``nccl.missing.silence_ms``.
A missing rank whose stack comes after the report (agents capture after ~10 s of silence; a desync may be
reported sooner) gets one more such record (``nccl.desync.update = true``) when it comes, at most once per rank
per hang, while the communicator has made no progress and for at most ``max_age``. Bounded: ``max_entries``
stacks and ``max_comms`` open hangs, least recently used out (counted as
``otel_ebpf.collective_join.unjoined{reason=stack_evicted}`` by the caller's ``evicted``). Single-threaded (the
join's).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_ebpf.core.events import AttrValue, LogRecord
from otel_ebpf.core.rankstack import RANK_STACK_EVENT

from .metrics import ranges_text

__all__ = ["DESYNC_EVENT", "HangStacks", "Stack"]

DESYNC_EVENT = "otel_ebpf.nccl.desync"
_BODY_STACK_BYTES = 8192  # of each missing rank's stack text in the desync record's body
_KEPT_STACK_BYTES = 16384  # of each received stack text kept (an agent bounds its own; a gateway trusts none)


@dataclass(frozen=True, slots=True)
class Stack:
    """One agent's stack record of rank ``rank`` of ``comm``: received at ``seen`` (join clock, s)."""

    comm: str
    rank: int
    seq: int
    seen: float
    silence_ms: float
    where: str  # "function (file:line)", or the capture's outcome when there is no frame
    host: str
    pid: int
    text: str


@dataclass
class _Hang:
    """An open desync of one communicator: the collective, who is missing, whose stack went out. ``since``: the
    report (join clock, s); ``first``: the collective's first arrival, what ``nccl.waited_ns`` counts from."""

    seq: int
    op: str
    missing: tuple[int, ...]
    waiting: tuple[int, ...]
    trace_id: int
    since: float
    first: float
    sent: set[int] = field(default_factory=set)


class HangStacks:
    """``wall_ns``: epoch ns for the records; ``front_seq(comm, rank)``: the rank's highest seq seen (-1: none);
    ``evicted``: called per stack or hang pushed out by the bounds."""

    def __init__(self, max_entries: int, max_comms: int, max_age: float, scope: str, wall_ns: Callable[[], int],
                 front_seq: Callable[[str, int], int], evicted: Callable[[], None]) -> None:
        self._stacks: OrderedDict[tuple[str, int], Stack] = OrderedDict()
        self._hangs: OrderedDict[str, _Hang] = OrderedDict()
        self._max_entries, self._max_comms, self._max_age = max_entries, max_comms, max_age
        self._scope, self._wall_ns, self._front_seq, self._evicted = scope, wall_ns, front_seq, evicted

    def is_stack(self, event_name: str | None) -> bool:
        return event_name == RANK_STACK_EVENT

    def add(self, attrs: Mapping[str, Any], body: Any, resource: Mapping[str, Any], now: float, out: list[object]
            ) -> None:
        """An agent's stack record (attributes, body, its resource's attributes): kept, and sent on in an update
        of an open desync that misses this rank."""
        comm, rank, seq = attrs.get("nccl.comm.id"), attrs.get("nccl.rank"), attrs.get("nccl.seq")
        if type(comm) is not str or type(rank) is not int or type(seq) is not int:
            return  # a split child's rank the agent did not know: not joinable by rank
        where = attrs.get("code.function.name")
        if where:
            where = f"{where} ({attrs.get('code.file.path', '?')}:{attrs.get('code.line.number', '?')})"
        else:
            where = f"no Python frame ({attrs.get('otel_ebpf.stack.outcome', 'unknown')})"
        stack = Stack(comm, rank, seq, now, float(attrs.get("nccl.silence_ms", 0)), str(where),
                      str(resource.get("host.name", "")), _int(resource.get("process.pid")),
                      str(body or "")[:_KEPT_STACK_BYTES])
        key = (comm, rank)
        self._stacks.pop(key, None)
        self._stacks[key] = stack
        while len(self._stacks) > self._max_entries:
            self._stacks.popitem(last=False)
            self._evicted()
        hang = self._hangs.get(comm)
        if hang is None or rank not in hang.missing or rank in hang.sent or now - hang.since > self._max_age:
            return
        if self._current(stack, now) is not None:
            hang.sent.add(rank)
            out.append(self._record(comm, hang, [stack], now, update=True))

    def desync(self, comm: str, seq: int, op: str, missing: Sequence[int], waiting: Sequence[int], hosts: Sequence[str],
               trace_id: int, waited_ns: int, now: float, out: list[object]) -> tuple[dict[str, AttrValue], str]:
        """A desync report: its log record (with the missing ranks' stacks known now) into ``out``; returns the
        stack attributes for the report's span event, and "; rank R is in F" per stack for its warning."""
        hang = self._hangs.get(comm)
        if hang is None or hang.seq != seq:
            hang = _Hang(seq, op, tuple(missing), tuple(waiting), trace_id, now, now - waited_ns / 1e9)
            self._hangs.pop(comm, None)
            self._hangs[comm] = hang
            while len(self._hangs) > self._max_comms:
                self._hangs.popitem(last=False)
                self._evicted()
        stacks = [s for r in missing if r not in hang.sent and (s := self._current(self._stacks.get((comm, r)), now))]
        hang.sent.update(s.rank for s in stacks)
        record = self._record(comm, hang, stacks, now, hosts=hosts, waited_ns=waited_ns)
        out.append(record)
        attrs = {k: v for k, v in record.attributes.items()
                 if k.startswith("nccl.missing.") and k != "nccl.missing.hosts"}
        return attrs, "".join(f"; rank {s.rank} is in {s.where}" for s in stacks)

    def progressed(self, comm: str, seq: int) -> None:
        """Collective ``seq`` of ``comm`` completed: a hang of an earlier one is over."""
        hang = self._hangs.get(comm)
        if hang is not None and seq >= hang.seq:
            del self._hangs[comm]

    def _current(self, stack: Stack | None, now: float) -> Stack | None:
        if stack is None or now - stack.seen > self._max_age:
            return None
        return stack if self._front_seq(stack.comm, stack.rank) == stack.seq else None

    def _record(self, comm: str, hang: _Hang, stacks: list[Stack], now: float, *, update: bool = False,
                hosts: Sequence[str] = (), waited_ns: int | None = None) -> LogRecord:
        waited = waited_ns if waited_ns is not None else int((now - hang.first) * 1e9)
        attrs: dict[str, AttrValue] = {
            "nccl.comm.id": comm, "nccl.seq": hang.seq, "nccl.op": hang.op, "nccl.missing_ranks": hang.missing,
            "nccl.waiting_ranks": hang.waiting, "nccl.waited_ns": waited}
        if hosts:
            attrs["nccl.missing.hosts"] = tuple(hosts)
        if update:
            attrs["nccl.desync.update"] = True
        if stacks:
            attrs["nccl.missing.stack_ranks"] = tuple(s.rank for s in stacks)
            attrs["nccl.missing.functions"] = tuple(s.where for s in stacks)
            attrs["nccl.missing.silence_ms"] = tuple(s.silence_ms for s in stacks)
        waiting = ranges_text(list(hang.waiting)) or "none"
        lines = [f"NCCL desync: comm {comm}, seq {hang.seq} ({hang.op}) has waited {waited / 1e9:.1f} s for rank"
                 f"{'s' if len(hang.missing) > 1 else ''} {ranges_text(list(hang.missing))} of "
                 f"{len(hang.missing) + len(hang.waiting)}; ranks {waiting} wait in it."]
        for s in stacks:
            lines.append(f"rank {s.rank} (host {s.host or '?'}, pid {s.pid}): silent {s.silence_ms / 1e3:.1f} s after "
                         f"seq {s.seq}, in {s.where}")
            lines.append(s.text[:_BODY_STACK_BYTES])
        return LogRecord(None, self._wall_ns(), DESYNC_EVENT, "\n".join(lines), attrs, severity="WARN",
                         scope=self._scope, trace_id=hang.trace_id)


def _int(value: Any) -> int:
    return value if type(value) is int else -1
