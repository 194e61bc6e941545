"""The cyclic garbage collector's settings for a process that is an otel-ebpf service (``run``, ``gateway``).

Every record on the span path (events, span records, SDK spans, their dicts and contexts) is a container the
collector tracks and none is part of a cycle: reference counting frees them all, and the collector's passes
only walk them. With CPython's defaults (700, 10, 10) a young pass runs every 700 allocations and walks every
record queued between stages, and full passes walk the whole heap. Measured with the pipeline benchmark
(``bench/run.py --pipeline-only [--default-gc]``: cudaMemcpy spans into the file exporter, 4 s runs,
docs/benchmarks.md): 2.4-4.7 µs of collector time a span at 40-60k spans/s (1,450-2,500 young, 130-230 middle
and 12-21 full passes a run) with the defaults; 0.0-1.0 µs with these settings.

:func:`tune` raises the young threshold to 10,000 allocations and the older generations' to 50 and 100 passes
(a full pass after ~50 million allocations instead of ~70,000), and, once the service has started, moves what the
start-up left on the heap (imported modules, BCC and its compiled programs, the SDK) out of the collector's
reach with ``gc.freeze()``, so a full pass walks only what was made since. Cycles are still collected, later:
what an uncollected cycle can hold is bounded by the young threshold.

Only the CLI's services call it; the Python API (:class:`otel_ebpf.Session`) runs inside the user's process and
leaves its collector alone.
"""
from __future__ import annotations

import gc

__all__ = ["THRESHOLDS", "freeze_startup", "tune"]

THRESHOLDS = (10_000, 50, 100)


def tune() -> None:
    """Set :data:`THRESHOLDS` (process-wide; idempotent)."""
    gc.set_threshold(*THRESHOLDS)


def freeze_startup() -> None:
    """Freeze everything alive now (call once the service has started: its modules, programs and stages are
    made). No collection first: it would walk the whole heap on the command's way to its first instruction, and
    what garbage it would have found is at most one young generation's cycles, kept."""
    gc.freeze()
