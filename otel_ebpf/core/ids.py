"""Derived ids: the same on every host and run.

The collective join gives every rank's span of one NCCL collective the same trace id,
derived from (communicator id, sequence number), so agents on different nodes agree without
talking. The Python and PyTorch processors derive their call spans' ids here, so the CUDA
processor can parent a CUDA call on the enclosing call's span without importing them. The
emitter puts such ids straight into the span's context (random ones otherwise).

The agent/gateway contract of one collective lives here, below both sides: every rank's agent
(the nccl processor) and the gateway (the collective_join processor) compute the trace id, the
root span id and the root span's attributes from :func:`collective_ids` and
:data:`COLLECTIVE_ROOT_ATTRIBUTES`, so neither restates them.
"""
from __future__ import annotations

import hashlib

__all__ = ["COLLECTIVE_ROOT_ATTRIBUTES", "call_ids", "collective_ids", "collective_root_span_id", "derive_id", "op_ids"]

# The rank-independent attributes a collective's root span carries (rank 0's agent emits it; the
# gateway synthesizes it from a rank span when rank 0's is missing).
COLLECTIVE_ROOT_ATTRIBUTES = ("nccl.op", "nccl.comm.id", "nccl.nranks", "nccl.seq", "nccl.count",
                              "nccl.datatype", "nccl.bytes", "nccl.redop", "nccl.root", "nccl.timing")


def derive_id(*parts: object, bits: int = 128) -> int:
    """A stable non-zero id from ``parts`` (blake2b), identical on every host and run."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=bits // 8).digest()
    return int.from_bytes(digest, "big") or 1


def call_ids(pid: int, tid: int, start_ns: int, root_ns: int) -> tuple[int, int]:
    """(trace id, span id) of the span of thread ``tid``'s call that started at ``start_ns``
    inside the outermost call that started at ``root_ns`` (epoch ns, as in PythonCall). The one
    source of these ids: otel_ebpf/processors/cuda uses it to parent CUDA calls on that span."""
    return (derive_id("py", pid, tid, root_ns or start_ns, bits=128),
            derive_id("py", pid, tid, start_ns, bits=64))


def op_ids(pid: int, tid: int, start_ns: int, root_ns: int) -> tuple[int, int]:
    """(trace id, span id) of the span of thread ``tid``'s operator call that started at
    ``start_ns`` under the outermost one that started at ``root_ns`` (epoch ns, as in TorchOp).
    The one source of these ids: otel_ebpf/processors/cuda uses it to parent CUDA calls on that span."""
    return (derive_id("torch", pid, tid, root_ns or start_ns, bits=128),
            derive_id("torch", pid, tid, start_ns, bits=64))


def collective_root_span_id(comm_id: str, seq: int) -> int:
    """The span id of collective ``seq`` of communicator ``comm_id``'s root span (64 bits): the
    parent of every rank's span, the same on every host."""
    return derive_id(comm_id, seq, "collective", bits=64)


def collective_ids(comm_id: str, seq: int, rank: int) -> tuple[int, int, int]:
    """(trace id, root span id, span id of ``rank``) of collective ``seq`` of ``comm_id``."""
    return (derive_id(comm_id, seq), collective_root_span_id(comm_id, seq),
            derive_id(comm_id, seq, rank, bits=64))
