"""Typed events of the PyTorch receiver.

Times are Unix epoch nanoseconds. ``start_ns`` is also the call's id within its thread;
``parent_start`` / ``root_start`` name the enclosing and the outermost probed operator call
(0: none), so spans nest without waiting for the parent, which is recorded after its children.

A top-level call (``depth`` 0) made inside a traced Python call (the python receiver) has
``root_start`` = that call's root_start tagged with :data:`otel_ebpf.core.ids.TORCH_ROOT_PYTHON`
and ``parent_start`` = the innermost traced Python call's start; one made outside any has,
when steps are on (receiver ``steps``), ``root_start`` = its step's start tagged with
:data:`~otel_ebpf.core.ids.TORCH_ROOT_STEP` and ``parent_start`` = the step's start. Every call
under it carries the same ``root_start``. The untagged time is ``root_start & (TORCH_ROOT_STEP - 1)``.
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.frozen import fast_init

__all__ = ["STEP_END_REASONS", "TorchOp", "TorchStep"]

# TorchStep.reason by torch.h TORCH_STEP_END_* value (index)
STEP_END_REASONS = ("", "optimizer", "profiler_step", "gap", "max_duration", "max_ops", "thread_exit")


@fast_init
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


@fast_init
@dataclass(frozen=True, slots=True)
class TorchStep:
    """One step of thread ``tid`` ended: ``ops`` top-level operator calls made outside traced
    Python calls, from ``start_ns`` (the first one's entry; the step's id) to ``end_ns`` (the
    last one's return; for ``reason`` optimizer, the Optimizer.step scope's exit). ``seq``: steps
    begun on the thread, from 1. ``reason``: what ended it, one of :data:`STEP_END_REASONS`."""

    pid: int
    tid: int
    start_ns: int
    end_ns: int
    ops: int
    seq: int
    reason: str
