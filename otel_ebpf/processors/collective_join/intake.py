"""The collective join's common case, a rank span that only joins its pending collective, taken in C.

:func:`intake` gives the processor a ``take(events, start) -> index`` (``_intake.c``, whose doc lists exactly what it
takes): from ``events[start]`` on, every span the Python path (``CollectiveJoin._span`` -> ``_ranked`` -> ``_add``)
would only add to a pending collective that it does not complete, added the same way, up to the first event that is
anything else, whose index it returns. The processor hands that event to its Python path and calls ``take`` again
after it, so every event is processed in its order by one path or the other. The Python path is the reference:
without the extension (an optional one, built with the project) it does all; tests/unit/processors/
test_collective_join_intake.py compares the two.

At 1,024 ranks the join's thread took a third of the gateway's CPU through gRPC (~5 of ~15 us a
rank span: docs/benchmarks.md, session 27); measured with it: docs/benchmarks.md, session 28.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from otel_ebpf.core.readable import ReadableSpan

from .store import Collective, Front, Store

try:
    from . import _intake  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - the extension is optional
    _intake = None

__all__ = ["AVAILABLE", "Take", "intake"]

AVAILABLE = _intake is not None
Take = Callable[[Sequence[object], int], int]


def intake(store: Store, named: frozenset[str], max_ranks: int) -> Take | None:
    """``store``'s C intake for spans whose ``_name`` is not in ``named`` (those the processor reads by name), or None
    without the extension."""
    if _intake is None:
        return None
    take: Take = _intake.Intake(ReadableSpan, Collective, Front, store, named, max_ranks).take
    return take
