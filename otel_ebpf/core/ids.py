"""Derived ids: the same on every host and run.

The collective join gives every rank's span of one NCCL collective the same trace id,
derived from (communicator id, sequence number), so agents on different nodes agree without
talking. The Python and PyTorch processors derive their call spans' ids here, so the CUDA
processor can parent a CUDA call on the enclosing call's span without importing them. The
emitter puts such ids straight into the span's context (random ones otherwise).

The agent/gateway contract of one collective lives here, below both sides: every rank's agent
(the nccl processor) and the gateway (the collective_join processor) compute the trace id, the
root span id and the root span's attributes from :func:`collective_ids` and
:data:`COLLECTIVE_ROOT_ATTRIBUTES`, so neither restates them. Likewise a split communicator's id
(:func:`split_comm_id`) and its rank order (:func:`split_ranks`, NCCL's own rule), which the agent
computes when it saw every parent rank's split and the gateway otherwise, from the split spans'
:data:`SPLIT_ATTRIBUTES`.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping

__all__ = ["COLLECTIVE_ROOT_ATTRIBUTES", "SPLIT_ATTRIBUTES", "SPLIT_NOCOLOR", "TORCH_ROOT_PYTHON", "TORCH_ROOT_STEP",
           "call_ids", "collective_ids", "collective_root_span_id", "derive_id", "op_ids", "split_comm_id",
           "split_ranks", "step_ids"]

# ncclCommSplit's color for "take part, get no communicator" (nccl.h NCCL_SPLIT_NOCOLOR)
SPLIT_NOCOLOR = -1
# What one rank's ncclCommSplit span carries for a join that resolves the children's ranks: the
# parent's id, the split's number among the parent's splits (k), the caller's rank in the parent,
# the parent's size, and the call's color and key. A child's collective span whose rank the agent
# could not resolve carries "nccl.parent.rank" (this process's rank in the parent).
SPLIT_ATTRIBUTES = ("nccl.parent.comm.id", "nccl.split.seq", "nccl.parent.rank", "nccl.parent.nranks",
                    "nccl.split.color", "nccl.split.key")

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
    return _call_trace_id(pid, tid, root_ns or start_ns), derive_id("py", pid, tid, start_ns, bits=64)


def _call_trace_id(pid: int, tid: int, root_ns: int) -> int:
    return derive_id("py", pid, tid, root_ns, bits=128)


# Tags on a PyTorch operator call's root (TorchOp.root_start, and the root the cuda receiver
# reads for a CUDA call made inside an operator: EnclosingCall.root_ns), set in the kernel
# (receivers/torch/torch.h, same values): the call's trace is that of a traced Python call
# (root = its root_start | TORCH_ROOT_PYTHON) or of a step of its thread (root = the step's
# start | TORCH_ROOT_STEP). Epoch and kernel ns stay below 1 << 62 until 2116, and the clock
# conversion adds an offset, so a tag survives it.
TORCH_ROOT_PYTHON = 1 << 63
TORCH_ROOT_STEP = 1 << 62
_TORCH_ROOT_TIME = TORCH_ROOT_STEP - 1


def step_ids(pid: int, tid: int, step_ns: int) -> tuple[int, int]:
    """(trace id, span id) of the ``pytorch.step`` span of thread ``tid``'s step that started at
    ``step_ns`` (epoch ns, as in TorchStep.start_ns): the root of its top-level operator calls."""
    return _step_trace_id(pid, tid, step_ns), derive_id("torch.step", pid, tid, step_ns, bits=64)


def _step_trace_id(pid: int, tid: int, step_ns: int) -> int:
    return derive_id("torch.step", pid, tid, step_ns, bits=128)


def op_ids(pid: int, tid: int, start_ns: int, root_ns: int) -> tuple[int, int]:
    """(trace id, span id) of the span of thread ``tid``'s operator call that started at
    ``start_ns`` under the outermost one that started at ``root_ns`` (epoch ns, as in TorchOp).
    A tagged ``root_ns`` puts it in the trace of that Python call (:data:`TORCH_ROOT_PYTHON`,
    :func:`call_ids`) or step (:data:`TORCH_ROOT_STEP`, :func:`step_ids`).
    The one source of these ids: otel_ebpf/processors/cuda uses it to parent CUDA calls on that span."""
    span_id = derive_id("torch", pid, tid, start_ns, bits=64)
    if root_ns & TORCH_ROOT_PYTHON:
        return _call_trace_id(pid, tid, root_ns & _TORCH_ROOT_TIME), span_id
    if root_ns & TORCH_ROOT_STEP:
        return _step_trace_id(pid, tid, root_ns & _TORCH_ROOT_TIME), span_id
    return derive_id("torch", pid, tid, root_ns or start_ns, bits=128), span_id


def collective_root_span_id(comm_id: str, seq: int) -> int:
    """The span id of collective ``seq`` of communicator ``comm_id``'s root span (64 bits): the
    parent of every rank's span, the same on every host."""
    return derive_id(comm_id, seq, "collective", bits=64)


def collective_ids(comm_id: str, seq: int, rank: int) -> tuple[int, int, int]:
    """(trace id, root span id, span id of ``rank``) of collective ``seq`` of ``comm_id``."""
    return (derive_id(comm_id, seq), collective_root_span_id(comm_id, seq),
            derive_id(comm_id, seq, rank, bits=64))


def split_comm_id(parent_id: str, k: int, color: int) -> str:
    """The id (16 hex digits) of the communicator of ``color`` made by the ``k``-th ncclCommSplit
    (from 0, NOCOLOR callers counted) of communicator ``parent_id``: every member derives it alone."""
    return format(derive_id("nccl.split", parent_id, k, color, bits=64), "016x")


def split_ranks(calls: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Every parent rank's (color, key) of one split -> parent rank -> (child rank, child nranks)
    for the ranks that get a communicator (color != NOCOLOR), as NCCL 2.28.9 src/init.cc
    ``commGetSplitInfo``: the child's ranks are the parent ranks of the same color ordered by key,
    equal keys by parent rank; its size is how many parent ranks chose that color. ``calls``
    must hold every parent rank's call (a missing rank would shift the others)."""
    by_color: dict[int, list[tuple[int, int]]] = {}
    for parent_rank, (color, key) in calls.items():
        if color != SPLIT_NOCOLOR:
            by_color.setdefault(color, []).append((key, parent_rank))
    out: dict[int, tuple[int, int]] = {}
    for members in by_color.values():
        members.sort()
        for child_rank, (_key, parent_rank) in enumerate(members):
            out[parent_rank] = (child_rank, len(members))
    return out
