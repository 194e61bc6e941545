"""PyTorch operator calls and steps (otel_ebpf/receivers/torch) -> spans and duration histograms;
everything else passes unchanged.

Operator spans (scope ``otel_ebpf.torch``), named after the operator's at::_ops struct (``addmm``,
``add__Tensor`` for ``add_.Tensor``), with ``pytorch.op.name`` (the same), ``pytorch.op.depth``
(probed operators enclosing it) and ``thread.id``. Nested without buffering through derived
ids (otel_ebpf.core.ids), as in the Python processor: ``span_id = H(pid, tid, start)``,
``parent_span_id = H(pid, tid, parent_start)``; the trace is the root's (``op_ids``):

* root tagged ``TORCH_ROOT_PYTHON``: the enclosing traced Python call's trace; a top-level
  call's parent is the innermost traced Python call (the python processor's span);
* root tagged ``TORCH_ROOT_STEP``: the step's trace; a top-level call's parent is the step's
  ``pytorch.step`` span;
* untagged (receiver ``steps: false``): one trace per outermost probed operator call.

Step spans: ``pytorch.step`` (the root of its trace, ids from ``step_ids``), one per
:class:`TorchStep`, from its first top-level call's entry to its last one's return, with
``pytorch.step.seq``, ``pytorch.step.ops`` (top-level calls), ``pytorch.step.end_reason`` and
``thread.id``. A step still open when the agent stops (its TorchStep never came) gets its span at
:meth:`TorchProcessor.shutdown` from the calls seen, with end_reason ``open``; one thread's
open step is tracked at a time, for at most ``MAX_OPEN_STEPS`` threads (the oldest then ends so).

Metrics: ``pytorch.op.duration`` histogram (s) by ``pytorch.op.name`` (cardinality bounded by
the receiver's operator list); ``pytorch.step.duration`` histogram (s) by ``pytorch.step.end_reason``.

Threading: single-threaded (the pipeline worker); ``consume`` never raises.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from otel_ebpf.core.events import Attributes, SpanRecord
from otel_ebpf.core.ids import TORCH_ROOT_PYTHON, TORCH_ROOT_STEP, call_ids, op_ids, step_ids
from otel_ebpf.core.pipeline import Consumer, Context
from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles

from ...receivers.torch.events import TorchOp, TorchStep
from .config import Config

__all__ = ["MAX_OPEN_STEPS", "METRICS", "SCOPE", "STEP_SPAN", "TorchProcessor"]

SCOPE = "otel_ebpf.torch"
STEP_SPAN = "pytorch.step"
MAX_OPEN_STEPS = 4096  # threads whose open step is tracked (for its span at shutdown)
METRICS: dict[str, MetricSpec] = {
    "pytorch.op.duration": ("histogram", "s", "Duration of probed ATen operator calls (at::_ops::<op>::call)."),
    "pytorch.step.duration": ("histogram", "s", "Duration of steps (top-level operator calls grouped per "
                                                "step of a thread), by what ended them."),
}
_TIME = TORCH_ROOT_STEP - 1  # the root's time without its tag


@dataclass(slots=True)
class _Open:
    """The step of a thread last seen in an operator call: its span if it never ends."""

    start: int
    end: int
    ops: int = 0
    ended: bool = False


class TorchProcessor(EventProcessor[Config]):
    """Processor ``torch``: TorchOp / TorchStep -> SpanRecord (derived ids) + duration histograms."""

    NAME = "torch"
    SCOPE = SCOPE
    METRICS = METRICS

    def __init__(self, config: Config, ctx: Context, next_: Consumer) -> None:
        super().__init__(config, ctx, next_)
        self._open: OrderedDict[tuple[int, int], _Open] = OrderedDict()

    @handles(TorchOp)
    def _op(self, ev: TorchOp, out: list[object]) -> None:
        self.metric(out, ev.pid, "pytorch.op.duration", (ev.end_ns - ev.start_ns) / 1e9, {"pytorch.op.name": ev.op})
        if not self.config.spans:
            return
        attrs: Attributes = {"pytorch.op.name": ev.op, "pytorch.op.depth": ev.depth, "thread.id": ev.tid}
        root = ev.root_start
        trace_id, span_id = op_ids(ev.pid, ev.tid, ev.start_ns, root)
        parent: int | None = None
        if ev.depth:
            parent = op_ids(ev.pid, ev.tid, ev.parent_start, root)[1] if ev.parent_start else None
        elif root & TORCH_ROOT_PYTHON:
            parent = call_ids(ev.pid, ev.tid, ev.parent_start, root & _TIME)[1]
        elif root & TORCH_ROOT_STEP:
            parent = step_ids(ev.pid, ev.tid, root & _TIME)[1]
            self._seen_in_step(ev, root & _TIME, out)
        out.append(SpanRecord(ev.pid, ev.op, ev.start_ns, ev.end_ns, attrs, scope=SCOPE,
                              trace_id=trace_id, span_id=span_id, parent_span_id=parent))

    def _seen_in_step(self, ev: TorchOp, step: int, out: list[object]) -> None:
        key = (ev.pid, ev.tid)
        st = self._open.get(key)
        if st is None or st.start != step:
            st = self._open[key] = _Open(step, ev.end_ns)
            self._open.move_to_end(key)
            if len(self._open) > MAX_OPEN_STEPS:
                (pid, tid), oldest = self._open.popitem(last=False)
                self._unended(pid, tid, oldest, out)
        st.end = max(st.end, ev.end_ns)
        st.ops += 1

    @handles(TorchStep)
    def _step(self, ev: TorchStep, out: list[object]) -> None:
        st = self._open.get((ev.pid, ev.tid))
        if st is not None and st.start == ev.start_ns:
            st.ended = True  # kept: a late call of this step must not reopen it
        self._step_span(ev.pid, ev.tid, ev.start_ns, ev.end_ns, ev.ops, ev.seq, ev.reason, out)

    def _step_span(self, pid: int, tid: int, start: int, end: int, ops: int, seq: int, reason: str,
                   out: list[object]) -> None:
        self.metric(out, pid, "pytorch.step.duration", max(end - start, 0) / 1e9, {"pytorch.step.end_reason": reason})
        if not self.config.spans:
            return
        trace_id, span_id = step_ids(pid, tid, start)
        attrs: Attributes = {"pytorch.step.ops": ops, "pytorch.step.end_reason": reason, "thread.id": tid,
                             **({"pytorch.step.seq": seq} if seq else {})}
        out.append(SpanRecord(pid, STEP_SPAN, start, max(end, start), attrs, scope=SCOPE, trace_id=trace_id,
                              span_id=span_id, parent_span_id=None))

    def _unended(self, pid: int, tid: int, st: _Open, out: list[object]) -> None:
        if not st.ended:
            self._step_span(pid, tid, st.start, st.end, st.ops, 0, "open", out)

    def shutdown(self) -> None:
        """Emits the span of every step still open (end_reason ``open``), then forgets them."""
        out: list[object] = []
        for (pid, tid), st in self._open.items():
            self._unended(pid, tid, st, out)
        self._open.clear()
        self.sums.flush(out)
        if out:
            self._next.consume(out)
