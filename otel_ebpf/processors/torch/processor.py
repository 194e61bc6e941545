"""PyTorch operator calls (otel_ebpf/receivers/torch) -> spans and a duration histogram; everything else
passes unchanged.

Spans (scope ``otel_ebpf.torch``), named after the operator's at::_ops struct (``addmm``,
``add__Tensor`` for ``add_.Tensor``), with ``pytorch.op.name`` (the same), ``pytorch.op.depth``
(probed operators enclosing it) and ``thread.id``. Nested without buffering through derived
ids, as in the Python processor: ``span_id = H(pid, tid, start)``, ``parent_span_id =
H(pid, tid, parent_start)``, ``trace_id = H(pid, tid, root_start)`` (one trace per outermost
probed operator call).

Metric: ``pytorch.op.duration`` histogram (s) by ``pytorch.op.name``; its cardinality is
bounded by the receiver's operator list.

Threading: single-threaded (the pipeline worker); ``consume`` never raises.
"""
from __future__ import annotations


from otel_ebpf.core.ids import op_ids
from otel_ebpf.core.events import Attributes, SpanRecord
from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles

from ...receivers.torch.events import TorchOp
from .config import Config

__all__ = ["METRICS", "SCOPE", "TorchProcessor"]

SCOPE = "otel_ebpf.torch"
METRICS: dict[str, MetricSpec] = {
    "pytorch.op.duration": ("histogram", "s", "Duration of probed ATen operator calls (at::_ops::<op>::call)."),
}


class TorchProcessor(EventProcessor[Config]):
    """Processor ``torch``: TorchOp -> SpanRecord (derived ids) + pytorch.op.duration."""

    NAME = "torch"
    SCOPE = SCOPE
    METRICS = METRICS

    @handles(TorchOp)
    def _op(self, ev: TorchOp, out: list[object]) -> None:
        self.metric(out, ev.pid, "pytorch.op.duration", (ev.end_ns - ev.start_ns) / 1e9, {"pytorch.op.name": ev.op})
        if not self.config.spans:
            return
        attrs: Attributes = {"pytorch.op.name": ev.op, "pytorch.op.depth": ev.depth, "thread.id": ev.tid}
        trace_id, span_id = op_ids(ev.pid, ev.tid, ev.start_ns, ev.root_start)
        parent = op_ids(ev.pid, ev.tid, ev.parent_start, ev.root_start)[1] if ev.parent_start else None
        out.append(SpanRecord(ev.pid, ev.op, ev.start_ns, ev.end_ns, attrs, scope=SCOPE,
                              trace_id=trace_id, span_id=span_id, parent_span_id=parent))
