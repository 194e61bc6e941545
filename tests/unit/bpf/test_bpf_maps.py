"""otel_ebpf.bpf.maps: cumulative BPF map counters read as deltas; the entries of gone
processes read one last time, then deleted from the map and the totals; array counters."""
from __future__ import annotations

import ctypes
from typing import Any

from otel_ebpf.bpf.maps import MapDeltas, Totals, array_deltas


class FakeMap(dict[Any, Any]):
    """What the readers use of a BCC hash map: items() (a list, as BCC's TableBase.items
    builds one, so entries can be deleted while it is walked) and del."""

    def items(self) -> list[tuple[Any, Any]]:  # type: ignore[override]
        return list(super().items())


def _reader() -> MapDeltas[tuple[int, int]]:
    return MapDeltas(lambda k: k, lambda per_cpu: (sum(per_cpu), max(per_cpu)))


def test_first_read_is_the_total_then_deltas() -> None:
    table, rd = FakeMap({(1, 0): [2, 3]}), _reader()
    assert [(r.key, r.total, r.delta) for r in rd.read(table, lambda pid: False)] == [((1, 0), (5, 3), (5, 3))]
    table[(1, 0)] = [4, 3]
    table[(2, 0)] = [1]
    rows = rd.read(table, lambda pid: False)
    assert [(r.key, r.delta, r.moved) for r in rows] == [((1, 0), (2, 1), True), ((2, 0), (1, 1), True)]
    assert rd.moved(table, lambda pid: False) == []


def test_gone_processes_are_read_a_last_time_then_deleted_and_asked_once() -> None:
    table = FakeMap({(1, 0): [1], (1, 1): [2], (2, 0): [3]})
    rd, asked = _reader(), []

    def gone(pid: int) -> bool:
        asked.append(pid)
        return pid == 1

    rows = rd.read(table, gone)
    assert asked == [1, 2]
    assert [(r.key, r.delta[0], r.gone) for r in rows] == [((1, 0), 1, True), ((1, 1), 2, True), ((2, 0), 3, False)]
    assert list(table) == [(2, 0)] and rd.totals.keys() == [(2, 0)]


def test_an_entry_deleted_under_the_reader_is_not_an_error() -> None:
    class Racing(FakeMap):
        def __delitem__(self, key: Any) -> None:
            raise KeyError(key)

    rows = _reader().read(Racing({(1, 0): [1]}), lambda pid: True)
    assert rows[0].gone


def test_int_keys_are_their_own_pid() -> None:
    rd: MapDeltas[int] = MapDeltas(lambda k: k, lambda v: (v,))
    assert rd.moved(FakeMap({7: 3}), lambda pid: pid == 7) == [(7, (3,))]
    assert len(rd.totals) == 0


def test_full_totals_keep_known_keys_and_refuse_new_ones() -> None:
    totals: Totals[str] = Totals(max_keys=1)
    assert totals.update("a", (1,)) == ((1,), True)
    assert totals.update("b", (5,)) == ((5,), False)
    assert totals.update("b", (6,)) == ((6,), False)  # still not remembered: counts from zero
    assert totals.update("a", (4,)) == ((3,), True)
    rd: MapDeltas[tuple[int, int]] = MapDeltas(lambda k: k, lambda v: (v,), max_keys=1)
    rows = rd.read(FakeMap({(1, 0): 1, (2, 0): 1, (3, 0): 1}), lambda pid: pid == 3)
    assert [r.kept for r in rows] == [True, False, True]  # a gone key is never counted as refused


class FakeArray:
    """What array_deltas uses of a BCC array: indexing by c_int, values with .value."""

    def __init__(self, *values: int) -> None:
        self.values = list(values)

    def __getitem__(self, key: ctypes.c_int) -> ctypes.c_uint64:
        return ctypes.c_uint64(self.values[key.value])


def test_array_counters_report_only_their_growth() -> None:
    table, seen = FakeArray(0, 3, 1), [0, 0, 0]
    assert array_deltas(table, ("a", "b", "c"), seen) == [("b", 3), ("c", 1)]
    table.values = [2, 3, 4]
    assert array_deltas(table, ("a", "b", "c"), seen) == [("a", 2), ("c", 3)]
    assert seen == [2, 3, 4] and array_deltas(table, ("a", "b", "c"), seen) == []
