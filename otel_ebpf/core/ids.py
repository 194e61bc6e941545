"""Derived ids: the same on every host and run.

The collective join gives every rank's span of one NCCL collective the same trace id,
derived from (communicator id, sequence number), so agents on different nodes agree without
talking. The emitter puts such ids straight into the span's context (random ones otherwise).
"""
from __future__ import annotations

import hashlib

__all__ = ["derive_id"]


def derive_id(*parts: object, bits: int = 128) -> int:
    """A stable non-zero id from ``parts`` (blake2b), identical on every host and run."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=bits // 8).digest()
    return int.from_bytes(digest, "big") or 1
