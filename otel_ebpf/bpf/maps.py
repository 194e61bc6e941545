"""Cumulative -> delta reading of the BPF maps of counters that receivers poll: hash maps of
per-key counters (:class:`MapDeltas`) and arrays of named counters (:func:`array_deltas`).

A BPF program only ever adds to its counters (one entry per key, often per CPU); the receiver
keeps the last total it read of each key and reports the difference. Keys start with a process
id: once that process is gone (:func:`otel_ebpf.host.procfs.process_gone`, or the receiver's own
test) its entry is read one last time, then deleted from the map and from the totals, so the map
keeps room for live processes and nothing is lost.

Thread safety: a :class:`MapDeltas` belongs to one thread (a receiver's poll thread); it holds
no lock. ``read`` never raises for an entry deleted under it (by the kernel or another reader).
"""
from __future__ import annotations

import contextlib
import ctypes as ct
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from otel_ebpf.host.procfs import process_gone

__all__ = ["CounterRow", "MapDeltas", "Totals", "array_deltas"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class CounterRow(Generic[K]):
    """One map entry as read: its ``key`` (as ``key_of`` made it), cumulative ``total``, ``delta``
    since the last read (the total itself on a key's first read), ``gone`` (its process has
    exited: the entry was deleted after this read) and ``kept`` (False when the totals were full
    and this live key's total was not remembered: its next delta counts from zero again; a
    receiver counts that as a drop)."""

    key: K
    total: tuple[int, ...]
    delta: tuple[int, ...]
    gone: bool
    kept: bool = True

    @property
    def moved(self) -> bool:
        """The first counter (by convention the event count) went up since the last read."""
        return self.delta[0] > 0


class Totals(Generic[K]):
    """The last cumulative totals read per key, at most ``max_keys`` of them (None: unbounded,
    which is right when the keys come from a BPF map, whose own size bounds them)."""

    def __init__(self, max_keys: int | None = None) -> None:
        self.max_keys = max_keys
        self._last: dict[K, tuple[int, ...]] = {}

    def update(self, key: K, total: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
        """(``total`` minus the last total of ``key``, or ``total`` on its first read; whether
        ``total`` is now remembered as the last). A new key is not remembered while full."""
        prev = self._last.get(key)
        delta = total if prev is None else tuple(a - b for a, b in zip(total, prev, strict=True))
        kept = prev is not None or self.max_keys is None or len(self._last) < self.max_keys
        if kept:
            self._last[key] = total
        return delta, kept

    def forget(self, key: K) -> None:
        """Drop ``key`` (its process is gone); a no-op for an unknown key."""
        self._last.pop(key, None)

    def keys(self) -> list[K]:
        """The keys remembered now, in first-read order."""
        return list(self._last)

    def __contains__(self, key: object) -> bool:
        return key in self._last

    def __len__(self) -> int:
        return len(self._last)


def _first(key: Any) -> int:
    return int(key[0]) if isinstance(key, tuple) else int(key)


class MapDeltas(Generic[K]):
    """Reads one BCC hash map (or per-CPU hash map) of cumulative counters as deltas.

    ``key_of`` turns a BCC key into a hashable ``K``; ``total_of`` a BCC value (a list of
    per-CPU values for a per-CPU map) into a tuple of cumulative counts; ``pid_of`` gives the
    process id of a ``K`` (default: the first element of a tuple key, or an int key itself).
    """

    def __init__(self, key_of: Callable[[Any], K], total_of: Callable[[Any], tuple[int, ...]], *,
                 pid_of: Callable[[K], int] = _first, max_keys: int | None = None) -> None:
        self.key_of = key_of
        self.total_of = total_of
        self.pid_of = pid_of
        self.totals: Totals[K] = Totals(max_keys)

    def read(self, table: Any, gone: Callable[[int], bool] = process_gone) -> list[CounterRow[K]]:
        """Every entry of ``table`` as a :class:`CounterRow`, in map order. ``gone(pid)`` is asked
        once per process per read; the entries of gone processes are deleted from ``table`` and
        from the totals after being read (their row is the final one)."""
        rows: list[CounterRow[K]] = []
        seen: dict[int, bool] = {}
        for bkey, value in table.items():
            key, total = self.key_of(bkey), self.total_of(value)
            delta, kept = self.totals.update(key, total)
            pid = self.pid_of(key)
            if pid not in seen:
                seen[pid] = gone(pid)
            if seen[pid]:
                with contextlib.suppress(KeyError):
                    del table[bkey]
                self.totals.forget(key)
            rows.append(CounterRow(key, total, delta, seen[pid], kept or seen[pid]))
        return rows

    def moved(self, table: Any, gone: Callable[[int], bool] = process_gone) -> list[tuple[K, tuple[int, ...]]]:
        """(key, delta) of the entries whose first counter went up since the last read (see
        :meth:`read`, which this is a filter of)."""
        return [(row.key, row.delta) for row in self.read(table, gone) if row.moved]


def array_deltas(table: Any, names: Sequence[str], seen: list[int]) -> list[tuple[str, int]]:
    """(name, growth since the last read) of each counter of the BPF array ``table`` that grew,
    slot ``i`` being ``names[i]``; ``seen`` holds the last total of each slot (start with zeros)
    and is brought up to date. Counters that did not grow are left out."""
    out = []
    for i, name in enumerate(names):
        total = int(table[ct.c_int(i)].value)
        if total > seen[i]:
            out.append((name, total - seen[i]))
            seen[i] = total
    return out
