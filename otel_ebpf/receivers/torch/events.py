"""Typed events of the PyTorch receiver.

Times are Unix epoch nanoseconds. ``start_ns`` is also the call's id within its thread;
``parent_start`` / ``root_start`` name the enclosing and the outermost probed operator call
(0: none), so spans nest without waiting for the parent, which is recorded after its children.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TorchOp"]


@dataclass(frozen=True, slots=True)
class TorchOp:
    """One call of a probed ATen operator (``op``: the at::_ops struct name, e.g. ``addmm``)."""

    pid: int
    tid: int
    op: str
    depth: int
    start_ns: int
    end_ns: int
    parent_start: int
    root_start: int
