"""PauseGuard.renew writes a slot's lease at most every eighth of a lease (a poll loop turns hundreds of
times a second), always leaving 7/8 of a lease or more; revoke, then renew, writes at once."""
from __future__ import annotations

import pytest

from otel_ebpf.bpf import pauseguard
from otel_ebpf.bpf.pauseguard import PauseGuard


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> tuple[PauseGuard, list[tuple[int, int]], list[int]]:
    clock = [10_000_000_000]
    monkeypatch.setattr(pauseguard, "now_ns", lambda: clock[0])
    g = PauseGuard(2.0)  # lease 1 s
    writes: list[tuple[int, int]] = []
    monkeypatch.setattr(g, "_write", lambda slot, value: writes.append((slot, value)))
    return g, writes, clock


def test_renewals_within_an_eighth_of_a_lease_write_once(guard) -> None:
    g, writes, clock = guard
    g.renew(1)
    for _ in range(100):
        clock[0] += 1_000_000  # 1 ms per turn
        g.renew(1)
    assert writes[0] == (1, 10_000_000_000 + g.lease_ns)
    assert len(writes) == 1  # 101 turns over 100 ms: the first writes, nothing more before 125 ms
    clock[0] += 25_000_000
    g.renew(1)
    assert writes[-1] == (1, clock[0] + g.lease_ns) and len(writes) == 2
    left = [value - t for (_, value), t in zip(writes, (10_000_000_000, clock[0]), strict=True)]
    assert left == [g.lease_ns, g.lease_ns]


def test_slots_are_renewed_apart_and_revoke_resets(guard) -> None:
    g, writes, clock = guard
    g.renew(1)
    g.renew(2)  # another loop's slot: its own write
    assert [s for s, _ in writes] == [1, 2]
    g.revoke(1)
    assert writes[-1] == (1, 0)
    clock[0] += 1_000_000
    g.renew(1)  # right after a revoke: written at once
    assert writes[-1] == (1, clock[0] + g.lease_ns)
