"""Communicator identity: the bounded comm table and every id the NCCL join derives.

A communicator id (``nccl.comm.id``, 16 hex digits) is computed identically by every rank of
the communicator, on any host, without the agents talking:

* ncclCommInitRank / ...Config / ...Scalable: ``derive_id("nccl.comm", unique_id.hex(), n)``
  where ``n`` counts this process's earlier successful inits with the same 128 bytes (every
  rank re-initialising from one unique id does so the same number of times);
* ncclCommSplit: ``derive_id("nccl.split", parent_id, k, color)``, ``k`` the number of
  earlier splits of the parent (splits are collective: every member calls them in order);
* ncclCommShrink: ``derive_id("nccl.shrink", parent_id, k, excluded ranks)``, ``k`` counted with the
  parent's splits (only survivors call it, and every survivor calls it in the same order);
* ncclCommInitAll: ``derive_id("nccl.initall", host, pid, k)``, ``k`` the process's earlier
  InitAll calls; its communicators have rank = index, nranks = ndev.

Join ids, from (comm id, seq) alone (so all ranks agree):

* collective ``seq``: :func:`otel_ebpf.core.ids.collective_ids`, the contract
  shared with the gateway's collective_join: trace ``derive_id(comm_id, seq)``, every rank's span
  has the root span (emitted by rank 0) as parent and its own span id from (comm_id, seq, rank);
* send #k from rank A to B and recv #k at B from A: trace ``derive_id(comm_id, "p2p", A, B, k)``,
  span ids ``derive_id(comm_id, "p2p", A, B, k, "send"|"recv", bits=64)``.

Not thread-safe: owned by the processor's single worker thread.
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.ids import derive_id, split_comm_id
from otel_ebpf.core.telemetry import Telemetry

__all__ = [
    "Comm",
    "CommTable",
    "comm_id_from_init_all",
    "comm_id_from_split",
    "comm_id_from_unique_id",
    "group_ids",
    "p2p_ids",
]


def _hex64(value: int) -> str:
    return format(value, "016x")


def comm_id_from_unique_id(unique_id: bytes, n: int) -> str:
    return _hex64(derive_id("nccl.comm", unique_id.hex(), n, bits=64))


def comm_id_from_split(parent_id: str, k: int, color: int) -> str:
    return split_comm_id(parent_id, k, color)  # the contract the gateway's join shares: core.ids


def comm_id_from_init_all(host: str, pid: int, k: int) -> str:
    return _hex64(derive_id("nccl.initall", host, pid, k, bits=64))


def p2p_ids(comm_id: str, src: int, dst: int, k: int) -> tuple[int, int, int]:
    """(trace id, send span id, recv span id) of send #k from rank ``src`` to ``dst``."""
    return (derive_id(comm_id, "p2p", src, dst, k),
            derive_id(comm_id, "p2p", src, dst, k, "send", bits=64),
            derive_id(comm_id, "p2p", src, dst, k, "recv", bits=64))


def group_ids(host: str, pid: int, group: int) -> tuple[int, int]:
    """(trace id, span id) of a process's group span: local, no other rank needs it."""
    return (derive_id("nccl.group", host, pid, group),
            derive_id("nccl.group", host, pid, group, "span", bits=64))


@dataclass(slots=True)
class Comm:
    """What is known of one communicator in one process. ``rank``/``nranks``/``device`` are
    None until learned (split children: from every parent rank's split call, see
    :mod:`.splits`, or from ncclCommUserRank/ncclCommCount). A split child also knows the split
    that made it (``split``: parent comm id, k) and this process's rank in the parent."""

    comm_id: str
    rank: int | None
    nranks: int | None
    device: int | None = None
    splits: int = 0
    parent_rank: int | None = None
    split: tuple[str, int] | None = None


class CommTable:
    """(pid, handle) -> :class:`Comm`, at most ``max_comms`` entries; plus the per-process
    counters ids are derived from, bounded the same way. A full table refuses the new entry
    and counts ``otel_ebpf.events.dropped{receiver=nccl, reason=comm_table_full}``: that
    communicator's calls are then emitted without join ids. Full counters count
    ``reason=comm_counters_full`` (a later repeat of that init could reuse an id).

    Ended communicators (:meth:`end`) are kept, at most ``max_comms`` of them (the oldest end
    forgotten first), until their process exits, for the calls that entered before the end and
    return after it: ncclCommAbort is called from another thread while a thread is blocked inside
    a call on that communicator (NCCL 2.28.9 src/init.cc ncclCommAbort; PyTorch's watchdog), and
    that call's record comes after the abort's. :meth:`for_call` gives such a call its ended
    communicator. A call whose ended communicator was forgotten is emitted as on an unknown one
    (counted ``otel_ebpf.nccl.unjoined{reason=unknown_comm}`` by the processor)."""

    def __init__(self, max_comms: int, telemetry: Telemetry, host: str) -> None:
        self.max_comms = max_comms
        self.host = host
        self._telemetry = telemetry
        self._comms: dict[tuple[int, int], Comm] = {}
        self._inits: dict[tuple[int, bytes], int] = {}
        self._init_alls: dict[int, int] = {}
        self._ended: dict[tuple[int, int], tuple[Comm, int]] = {}  # (pid, handle) -> (comm, end's return ns)
        self._pids: set[int] = set()  # processes that made a communicator the uprobes saw, until they exit

    def __len__(self) -> int:
        return len(self._comms)

    def get(self, pid: int, handle: int) -> Comm | None:
        return self._comms.get((pid, handle))

    def add(self, pid: int, handle: int, comm: Comm) -> bool:
        key = (pid, handle)
        if key not in self._comms and len(self._comms) >= self.max_comms:
            self._telemetry.dropped("nccl", "comm_table_full")
            return False
        self._comms[key] = comm  # a reused handle (freed, then allocated again) is a new comm
        self._pids.add(pid)
        return True

    def probed(self, pid: int) -> bool:
        """Whether the uprobes saw ``pid`` make a communicator (it may have ended since)."""
        return pid in self._pids

    def end(self, pid: int, handle: int, end_ns: int) -> Comm | None:
        """Removes the communicator, destroyed or aborted by a call that returned at ``end_ns``, and keeps it
        for the calls on it still inside NCCL then (class doc). Returns it, or None if it was unknown."""
        comm = self._comms.pop((pid, handle), None)
        if comm is None:
            return None
        key = (pid, handle)
        self._ended.pop(key, None)  # the handle's earlier communicator: its calls entered before this one's
        if len(self._ended) >= self.max_comms:
            del self._ended[next(iter(self._ended))]
        self._ended[key] = (comm, end_ns)
        return comm

    def for_call(self, pid: int, handle: int, start_ns: int) -> Comm | None:
        """The communicator of a call that entered at ``start_ns``: the ended one on that handle if the call
        entered before its end returned (a newer communicator may have the handle now), else the live one."""
        ended = self._ended.get((pid, handle))
        if ended is not None and start_ns <= ended[1]:
            return ended[0]
        return self._comms.get((pid, handle))

    def forget_process(self, pid: int) -> None:
        self._pids.discard(pid)
        for key in [k for k in self._comms if k[0] == pid]:
            del self._comms[key]
        for key in [k for k in self._ended if k[0] == pid]:
            del self._ended[key]
        for init_key in [k for k in self._inits if k[0] == pid]:
            del self._inits[init_key]
        self._init_alls.pop(pid, None)

    def clear(self) -> None:
        self._pids.clear()
        self._comms.clear()
        self._ended.clear()
        self._inits.clear()
        self._init_alls.clear()

    def next_init_id(self, pid: int, unique_id: bytes) -> str:
        """The id of this process's next communicator from ``unique_id`` (counts it)."""
        key = (pid, bytes(unique_id))
        n = self._inits.get(key, 0)
        if key in self._inits or len(self._inits) < self.max_comms:
            self._inits[key] = n + 1
        else:  # a later init from these same bytes would then reuse this id
            self._telemetry.dropped("nccl", "comm_counters_full")
        return comm_id_from_unique_id(unique_id, n)

    def next_split(self, parent: Comm, color: int) -> tuple[int, str]:
        """(k, child id) of the parent's next split, its k-th (counts it, NOCOLOR members included)."""
        k = parent.splits
        parent.splits += 1
        return k, comm_id_from_split(parent.comm_id, k, color)

    def next_shrink(self, parent: Comm, excluded: tuple[int, ...]) -> str:
        """The id of the parent's next shrink child (counts it among the parent's splits)."""
        k = parent.splits
        parent.splits += 1
        return _hex64(derive_id("nccl.shrink", parent.comm_id, k, sorted(set(excluded)), bits=64))

    def holders(self, comm_id: str) -> int:
        """How many (process, handle) entries are communicator ``comm_id``: its ranks seen here."""
        return sum(1 for comm in self._comms.values() if comm.comm_id == comm_id)

    def next_init_all_id(self, pid: int) -> str:
        k = self._init_alls.get(pid, 0)
        if pid in self._init_alls or len(self._init_alls) < self.max_comms:
            self._init_alls[pid] = k + 1
        else:
            self._telemetry.dropped("nccl", "comm_counters_full")
        return comm_id_from_init_all(self.host, pid, k)
