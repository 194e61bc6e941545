"""Histogram bucket bounds, the one layout shared by the kernel (the CUDA program's in-kernel
bucket counts, compiled in as -D constants) and the emitter's histograms.

Seconds: latency buckets from 5 us to 60 s; everything else (bytes, threads, counts): powers of
four from 1 to 4 Gi. A bucket-count array has ``len(bounds) + 1`` entries (the last: above the
highest bound), as OTLP explicit-bucket histograms have.
"""
from __future__ import annotations

__all__ = ["bounds_for_unit"]

_SECONDS = (0.0, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
            2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_POWERS_OF_4 = tuple(float(4 ** i) for i in range(0, 17))  # 1 .. 4 Gi


def bounds_for_unit(unit: str) -> tuple[float, ...]:
    """Latency buckets for seconds; powers of four (bytes, threads, counts) otherwise."""
    return _SECONDS if unit == "s" else _POWERS_OF_4
