"""Per process: its communicators' last NCCL calls, its longest recent gap, when it may be captured next.

Pure bookkeeping in event time (epoch ns), no threads, no I/O: :class:`RankTable` is owned by the
nccl_watch processor on the pipeline worker. Bounded: ``max_processes`` processes (the one whose last
call is oldest is forgotten) and ``max_comms`` communicators per process (least recently used
forgotten); each forgetting is returned to the caller to count.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["CommState", "Due", "Rank", "RankTable"]


@dataclass(slots=True)
class CommState:
    """The last call of one process on one communicator."""

    comm_id: str
    end_ns: int
    op: str
    seq: int | None
    rank: int | None
    nranks: int | None


@dataclass(slots=True)
class Rank:
    """One process. ``gap_ns`` (decaying, as of ``gap_at_ns``): its longest recent gap between two calls.
    ``next_ns``: no capture before. ``episode``: captures in the silence under way (0: none yet)."""

    pid: int
    comms: OrderedDict[str, CommState] = field(default_factory=OrderedDict)
    last_ns: int = 0
    gap_ns: float = 0.0
    gap_at_ns: int = 0
    next_ns: int = 0
    episode: int = 0
    suppressed: bool = False  # this silence was already counted as suppressed
    pending: bool = False  # a capture is queued or running
    graph_comms: set[str] = field(default_factory=set)  # used under CUDA graph capture: not watched


@dataclass(frozen=True, slots=True)
class Due:
    """A process due for a capture at ``now_ns``: silent ``silence_ns`` (since its last call on any
    communicator), over ``threshold_ns``; ``comms`` as they were then."""

    pid: int
    now_ns: int
    silence_ns: int
    threshold_ns: int
    comms: tuple[CommState, ...]


class RankTable:
    """The watched processes. Not thread-safe (the pipeline worker's)."""

    def __init__(self, *, min_silence_s: float, max_silence_s: float, factor: float, half_life_s: float,
                 max_processes: int, max_comms: int) -> None:
        self._min, self._max = int(min_silence_s * 1e9), int(max_silence_s * 1e9)
        self._factor, self._half_life = factor, half_life_s * 1e9
        self._max_processes, self._max_comms = max_processes, max_comms
        self.ranks: OrderedDict[int, Rank] = OrderedDict()  # least recently called first

    def __len__(self) -> int:
        return len(self.ranks)

    def call(self, pid: int, comm: CommState) -> list[str]:
        """A call ended (``comm`` as it is after it). Returns what was forgotten to make room:
        'rank_table_full' / 'comm_table_full' each time."""
        forgotten: list[str] = []
        rank = self._rank(pid, forgotten)
        if comm.comm_id in rank.graph_comms:
            return forgotten
        if rank.last_ns and comm.end_ns > rank.last_ns:
            gap = comm.end_ns - rank.last_ns
            rank.gap_ns, rank.gap_at_ns = max(float(gap), self._decayed(rank, comm.end_ns)), comm.end_ns
        rank.last_ns = max(rank.last_ns, comm.end_ns)
        rank.episode, rank.suppressed = 0, False
        rank.comms.pop(comm.comm_id, None)
        rank.comms[comm.comm_id] = comm
        if len(rank.comms) > self._max_comms:
            rank.comms.popitem(last=False)
            forgotten.append("comm_table_full")
        return forgotten

    def graph_captured(self, pid: int, comm_id: str) -> list[str]:
        """``comm_id`` was used under CUDA graph capture in ``pid``: its replays make no NCCL call the
        probes see, so silence there means nothing; it is not watched from now on (at most ``max_comms``
        such communicators per process are remembered). Returns what was forgotten, as :meth:`call`."""
        forgotten: list[str] = []
        rank = self._rank(pid, forgotten)
        rank.comms.pop(comm_id, None)
        if len(rank.graph_comms) < self._max_comms:
            rank.graph_comms.add(comm_id)
        return forgotten

    def _rank(self, pid: int, forgotten: list[str]) -> Rank:
        """``pid``'s entry, made (forgetting the least recently called process when full) or moved last."""
        rank = self.ranks.get(pid)
        if rank is None:
            rank = self.ranks[pid] = Rank(pid)
            if len(self.ranks) > self._max_processes:
                self.ranks.popitem(last=False)
                forgotten.append("rank_table_full")
        else:
            self.ranks.move_to_end(pid)
        return rank

    def forget(self, pid: int) -> None:
        self.ranks.pop(pid, None)

    def threshold_ns(self, rank: Rank, now_ns: int) -> int:
        """min(max_silence, max(min_silence, factor x the decayed longest gap))."""
        return int(min(self._max, max(self._min, self._factor * self._decayed(rank, now_ns))))

    def _decayed(self, rank: Rank, now_ns: int) -> float:
        if not rank.gap_ns:
            return 0.0
        return float(rank.gap_ns * 0.5 ** (max(0, now_ns - rank.gap_at_ns) / self._half_life))

    def silent(self, now_ns: int) -> list[tuple[Rank, Due]]:
        """The processes silent past their threshold at ``now_ns`` with no capture pending (the caller
        decides which are captured: rate, budget, liveness)."""
        out = []
        for rank in self.ranks.values():
            if rank.pending or not rank.comms:
                continue
            last = max(c.end_ns for c in rank.comms.values())
            threshold = self.threshold_ns(rank, now_ns)
            if now_ns - last > threshold:
                out.append((rank, Due(rank.pid, now_ns, now_ns - last, threshold, tuple(rank.comms.values()))))
        return out
