"""Calls inside an NCCL group, held until the group's outermost end says whether it was simulated.

``ncclGroupSimulateEnd`` (NCCL >= 2.22; PyTorch's ``_time_estimator``, Inductor's NCCL estimator) closes
a group and launches nothing: NCCL 2.28.9 src/group.cc ``ncclGroupEndInternal(simInfo)`` only models
its members' time. Whether a group is simulated is known only at that end, after its members returned,
so the processor holds every call made inside a group (``NcclCollective``/``NcclP2P`` with a group id)
until the ``NcclGroup`` record of that (process, group): at most ``max_held`` calls in all, each at most
``wait_ns`` (event time); beyond the bound a call is not held (passed on as a normal call, counted by the
processor), and calls whose group never ends (bound, time, process exit, shutdown) are released as normal.

Simulated calls took sequence numbers in the kernel (nccl.bpf.c numbers each call at its return) that no
other rank's calls match, so they are given back here: later calls of that communicator (collectives),
or of that (communicator, peer, direction) (send/recv), have their number lowered by the count of
simulated calls before them (:meth:`GroupBook.renumber`; at most ``max_offsets`` such counters, beyond
which the count is lost and counted by the processor).

Not thread-safe: owned by the processor's single worker thread.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict

from otel_ebpf.receivers.nccl.events import NcclCollective, NcclP2P

__all__ = ["GroupBook"]

_Op = NcclCollective | NcclP2P
_Key = tuple[int, int, int, str]  # pid, handle, peer (-1: collectives), op ("" for collectives)


def _counter(ev: _Op) -> _Key:
    if isinstance(ev, NcclP2P):
        return ev.pid, ev.comm, ev.peer, ev.op
    return ev.pid, ev.comm, -1, ""


class GroupBook:
    """Held group members per (pid, group), and the sequence numbers simulated calls took (module doc)."""

    def __init__(self, max_held: int, wait_ns: int, max_offsets: int) -> None:
        self.max_held = max_held
        self.wait_ns = wait_ns
        self.max_offsets = max_offsets
        self._held: OrderedDict[tuple[int, int], list[tuple[int, _Op]]] = OrderedDict()
        self._held_count = 0
        self._offsets: dict[_Key, int] = {}

    @property
    def held(self) -> int:
        return self._held_count

    def hold(self, ev: _Op) -> bool:
        """Hold a call made inside group ``ev.group``; False when the bound is reached (emit it now)."""
        if self._held_count >= self.max_held:
            return False
        self._held.setdefault((ev.pid, ev.group), []).append((ev.end_ns, ev))
        self._held_count += 1
        return True

    def end(self, pid: int, group: int) -> list[_Op]:
        """The calls held for the group that just ended, in call order."""
        calls = self._held.pop((pid, group), [])
        self._held_count -= len(calls)
        return [ev for _t, ev in calls]

    def expired(self, now_ns: int, pid: int | None = None) -> list[_Op]:
        """Calls of groups that did not end in time (``wait_ns``), or of process ``pid`` (it exited)."""
        out: list[_Op] = []
        for key in list(self._held):
            calls = self._held[key]
            if key[0] == pid or now_ns - calls[0][0] >= self.wait_ns:
                out.extend(ev for _t, ev in self._held.pop(key))
                self._held_count -= len(calls)
        return out

    def drain(self) -> list[_Op]:
        out = [ev for calls in self._held.values() for _t, ev in calls]
        self._held.clear()
        self._held_count = 0
        return out

    def simulated(self, ev: _Op) -> bool:
        """Give back the number a simulated call took; False when it cannot be remembered (bound)."""
        if ev.seq is None:
            return True
        key = _counter(ev)
        if key not in self._offsets and len(self._offsets) >= self.max_offsets:
            return False
        self._offsets[key] = self._offsets.get(key, 0) + 1
        return True

    def renumber(self, ev: _Op) -> _Op:
        """``ev`` with its number lowered by the simulated calls before it on the same counter."""
        n = self._offsets.get(_counter(ev), 0) if self._offsets and ev.seq is not None else 0
        return dataclasses.replace(ev, seq=ev.seq - n) if n and ev.seq is not None else ev

    def forget_comm(self, pid: int, handle: int) -> None:
        """The communicator ended: its handle may be reused by a new one, numbered from 0."""
        for key in [k for k in self._offsets if k[0] == pid and k[1] == handle]:
            del self._offsets[key]

    def forget_process(self, pid: int) -> None:
        for key in [k for k in self._offsets if k[0] == pid]:
            del self._offsets[key]

    def clear(self) -> None:
        self.drain()
        self._offsets.clear()
