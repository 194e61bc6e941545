"""Split communicators' ranks, resolved on the agent: ncclCommSplit is a collective over the parent.

PyTorch (``init_process_group(..., device_id=...)``: FSDP2, DeviceMesh, ``new_group``,
``split_group``) makes every subgroup with ``ncclCommSplit(parent, color, key, &child, config)``
and never asks NCCL the child's rank or size. Neither is in any one rank's arguments: NCCL
allgathers every parent rank's (color, key) and orders each color's ranks by key, then parent
rank (NCCL 2.28.9 src/init.cc ``commGetSplitInfo``; :func:`otel_ebpf.core.ids.split_ranks`).
So this agent resolves them when it has seen the split call of EVERY rank of the parent (its
processes hold all of the parent's ranks: a single-node job, any depth of nesting once the
parent's rank is known). Otherwise the split spans carry :data:`~otel_ebpf.core.ids.SPLIT_ATTRIBUTES`
and the gateway's collective_join resolves the ranks.

While a locally resolvable split waits for its last rank's call (ranks return from the split at
slightly different times, so a fast rank's first collective on the child can be read before a
slow rank's split record), the child's calls are held here: at most ``max_held`` calls, each at
most ``wait_ns`` (measured in event time). Calls released unresolved (bound, time, process exit,
shutdown) keep the parent rank for the gateway; each is counted by the processor.

Non-blocking splits (``config.blocking = 0``; PyTorch's ``TORCH_NCCL_USE_COMM_NONBLOCKING=1``):
NCCL sets ``*newcomm = NULL`` on entry and its init thread stores the child there when it is ready
(NCCL 2.28.9 src/init.cc ``ncclCommInitChildComm``: "*newcomm should be NCCL_COMM_NULL until comm split
fully complete"; ``ncclCommInitRankFunc``), so the handle is unknown at return (ncclCommShrink makes its
child the same way). A process may make several such children before using any, and use them in any
order (a 2-D DeviceMesh makes dp then tp; tensor parallel uses tp first), so no order tells which handle
is whose. The BPF program keeps each pending child's ``newcomm`` address, reads them when a call arrives
on a handle it does not know, and names the exact child in a :class:`NcclCommBind` (nccl.bpf.c); here the
child waits under (process, ``newcomm``) for it (:meth:`SplitBook.expect_handle` / :meth:`SplitBook.bind`).

Not thread-safe: owned by the processor's single worker thread.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from otel_ebpf.core.ids import split_ranks

from .comms import Comm

__all__ = ["Held", "SplitBook", "SplitKey"]

SplitKey = tuple[str, int]  # (parent comm id, k: the parent's k-th split)


@dataclass(slots=True)
class _Split:
    """One split of one parent as this agent saw it."""

    nranks: int
    calls: dict[int, tuple[int, int]] = field(default_factory=dict)  # parent rank -> (color, key)
    children: list[Comm] = field(default_factory=list)  # local child communicators (this split's)
    local: bool = False  # every parent rank is in a process of this agent: hold the children's calls


@dataclass(frozen=True, slots=True)
class Held:
    """A call held until its communicator's rank is known: ``time_ns`` when it was held."""

    pid: int
    time_ns: int
    event: object


class SplitBook:
    """The splits seen (at most ``max_splits``, oldest forgotten first), the calls held for their
    children (at most ``max_held`` over all, each at most ``wait_ns``), and the non-blocking children
    still waiting for their handle, by (process, newcomm address) (at most ``max_splits``)."""

    def __init__(self, max_splits: int, max_held: int, wait_ns: int) -> None:
        self.max_splits = max_splits
        self.max_held = max_held
        self.wait_ns = wait_ns
        self._splits: OrderedDict[SplitKey, _Split] = OrderedDict()
        self._held: OrderedDict[str, list[Held]] = OrderedDict()  # child comm id -> calls, oldest first
        self._held_count = 0
        self._unbound: dict[tuple[int, int], Comm] = {}

    def __len__(self) -> int:
        return len(self._splits)

    @property
    def held(self) -> int:
        return self._held_count

    def record(self, key: SplitKey, parent: Comm, color: int, split_key: int, child: Comm | None,
               local_members: int) -> list[Comm]:
        """One parent rank's split call (``parent.rank``/``nranks`` known). ``local_members``: how
        many of this agent's processes hold the parent. Returns the local children whose rank and
        size this call resolved (set on them), empty while calls are missing."""
        assert parent.rank is not None and parent.nranks is not None
        split = self._splits.get(key)
        if split is None:
            while len(self._splits) >= self.max_splits:
                self._splits.popitem(last=False)
            split = self._splits[key] = _Split(parent.nranks)
        split.local = split.local or local_members >= split.nranks
        split.calls[parent.rank] = (color, split_key)
        if child is not None:
            split.children.append(child)
        if len(split.calls) < split.nranks:
            return []
        del self._splits[key]
        ranks = split_ranks(split.calls)
        for comm in split.children:
            if comm.parent_rank is not None and comm.parent_rank in ranks:
                comm.rank, comm.nranks = ranks[comm.parent_rank]
        return split.children

    def hold(self, comm: Comm, pid: int, time_ns: int, event: object) -> bool:
        """Hold ``event`` (a call on ``comm``, whose rank is unknown) when its split is locally
        resolvable and still waits for ranks; False: emit it now."""
        split = self._splits.get(comm.split) if comm.split is not None else None
        if split is None or not split.local:
            return False
        self._held.setdefault(comm.comm_id, []).append(Held(pid, time_ns, event))
        self._held_count += 1
        return True

    def release(self, comm_id: str) -> list[Held]:
        """The calls held for ``comm_id``, oldest first (it was resolved)."""
        calls = self._held.pop(comm_id, [])
        self._held_count -= len(calls)
        return calls

    def expired(self, now_ns: int, pid: int | None = None) -> list[Held]:
        """Calls to emit unresolved: beyond ``max_held``, older than ``wait_ns``, or (``pid`` given:
        the process exited) that process's."""
        out: list[Held] = []
        for comm_id in list(self._held):
            over = self._held_count > self.max_held  # the oldest communicator's calls go first
            keep: list[Held] = []
            for h in self._held[comm_id]:
                gone = over or h.pid == pid or now_ns - h.time_ns >= self.wait_ns
                (out if gone else keep).append(h)
            self._held_count -= len(self._held[comm_id]) - len(keep)
            if keep:
                self._held[comm_id] = keep
            else:
                del self._held[comm_id]
        return out

    def drain(self) -> list[Held]:
        """Every held call (shutdown)."""
        out = [h for calls in self._held.values() for h in calls]
        self._held.clear()
        self._held_count = 0
        return out

    # -- non-blocking children ---------------------------------------------------------------
    def expect_handle(self, pid: int, newcomm: int, child: Comm) -> bool:
        """``child`` of a non-blocking split or shrink of ``pid`` will be published at address ``newcomm``.
        A child already waiting there is replaced (its NCCLComm was freed, the memory reused: the BPF
        program keeps one slot per address too). False when the bound is reached."""
        key = (pid, newcomm)
        if key not in self._unbound and len(self._unbound) >= self.max_splits:
            return False
        self._unbound[key] = child
        return True

    def bind(self, pid: int, newcomm: int) -> Comm | None:
        """The child of ``pid`` published at ``newcomm`` (taken), or None when none waits there."""
        return self._unbound.pop((pid, newcomm), None)

    def forget_process(self, pid: int) -> None:
        for key in [k for k in self._unbound if k[0] == pid]:
            del self._unbound[key]

    def clear(self) -> None:
        self._splits.clear()
        self._unbound.clear()
        self.drain()
