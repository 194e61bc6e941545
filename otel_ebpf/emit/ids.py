"""Span and trace ids: random by default, forced when a processor derived them.

The collective join gives every rank's span of one NCCL collective the same trace id,
derived from (communicator id, sequence number), so agents on different nodes agree without
talking. The SDK asks its ``IdGenerator`` for ids; this one returns a forced id when the
calling thread set one with :func:`forced_ids`, else a random one.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator

from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

__all__ = ["ForcibleIdGenerator", "derive_id", "forced_ids"]

_local = threading.local()


class ForcibleIdGenerator(IdGenerator):
    """Thread-safe: forced ids live in thread-local state."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        forced = getattr(_local, "span_id", None)
        if forced is not None:
            _local.span_id = None
            return forced
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        forced = getattr(_local, "trace_id", None)
        if forced is not None:
            _local.trace_id = None
            return forced
        return self._random.generate_trace_id()


@contextlib.contextmanager
def forced_ids(trace_id: int | None, span_id: int | None) -> Iterator[None]:
    """Within the block, the next generated trace/span id on this thread are these."""
    _local.trace_id, _local.span_id = trace_id, span_id
    try:
        yield
    finally:
        _local.trace_id = _local.span_id = None


def derive_id(*parts: object, bits: int = 128) -> int:
    """A stable non-zero id from ``parts`` (blake2b), identical on every host and run."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=bits // 8).digest()
    return int.from_bytes(digest, "big") or 1
