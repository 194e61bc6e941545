"""LibraryGate._renew_all (otel_ebpf.bpf.gate) against a stand-in of the program's oe_paused map: a stop the
gate holds is re-recorded before it is pause_timeout old, however its time falls between two renewals
(every half pause_timeout). The case that failed: three processes opened libcudart together; one
stopped just after a renewal was too young for the next (younger than half) and was renewed only at
pause_timeout itself, when the pause guard resumed it first."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from otel_ebpf.bpf import gate as gate_mod
from otel_ebpf.bpf import paused as paused_map
from otel_ebpf.bpf.gate import LibraryGate

_T = 1.5  # pause_timeout, s


class _Paused:
    """{(pid, ts)} as the program records its stops; rekey as otel_ebpf.bpf.paused.rekey."""

    def __init__(self) -> None:
        self.stops: set[tuple[int, int]] = set()

    def rekey(self, _bpf: object, pid: int, ts: int, new: int) -> bool:
        if (pid, ts) not in self.stops:
            return False
        self.stops.add((pid, new))
        self.stops.discard((pid, ts))
        return True


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> tuple[SimpleNamespace, _Paused, list[int]]:
    table = _Paused()
    clock = [1_000_000_000_000]
    monkeypatch.setattr(paused_map, "stops", lambda _bpf: sorted(table.stops))
    monkeypatch.setattr(paused_map, "rekey", table.rekey)
    monkeypatch.setattr(gate_mod.time, "clock_gettime_ns", lambda _clock: clock[0])
    g = SimpleNamespace(ctx=SimpleNamespace(pause_timeout=_T), _bpf=None, _rekeyed={}, _origin={})
    return g, table, clock


def test_no_stop_gets_pause_timeout_old_between_renewals(held) -> None:
    g, table, clock = held
    step = int(_T * 1e9 / 2)  # the renewals' period (LibraryGate._wait)
    # stops made at every 50 ms of one period after a renewal
    table.stops = {(100 + i, clock[0] + i * 50_000_000) for i in range(step // 50_000_000)}
    made = {pid: ts for pid, ts in table.stops}
    oldest = 0
    for _ in range(6):
        clock[0] += step
        now = clock[0]
        oldest = max(oldest, *(now - ts for _, ts in table.stops))
        LibraryGate._renew_all(g)  # type: ignore[arg-type]
    assert oldest < _T * 1e9 * 0.8, oldest / 1e9  # ~3/4 of pause_timeout at most, before the guard's tick
    assert {pid for pid, _ in table.stops} == set(made)  # none lost, each still recorded once
    assert all(ts > made[pid] for pid, ts in table.stops)


def test_only_renews_that_stop_whatever_its_age(held) -> None:
    g, table, clock = held
    first = clock[0]
    table.stops = {(1, first), (2, first - 10_000_000)}
    clock[0] += 1_000_000  # 1 ms old: younger than any threshold, renewed all the same when asked for
    LibraryGate._renew_all(g, only=(1, first))  # type: ignore[arg-type]
    assert (2, first - 10_000_000) in table.stops
    assert [ts for pid, ts in table.stops if pid == 1] == [clock[0]]  # now + its index in the map (0)
    assert g._rekeyed == {(1, first): clock[0]}
