"""PyTorch receiver: uprobes on libtorch_cpu's dispatcher entry points at::_ops::<op>::call for a
configurable operator list -> typed :class:`~.events.TorchOp` events, paired and nested in the
kernel per thread. Cost grows with the operator call rate, so it is off by default: enable it
by naming it in ``service.pipelines``. The ``torch`` processor turns the events into spans.

Traces. Operator calls nest under the operator calls that made them (linear -> addmm), and the
CUDA calls they make nest under them (cuda receiver). What encloses a top-level call (one made
inside no probed operator) is decided in the kernel at its entry:

* inside a traced Python call (the ``python`` receiver in the same agent): that call. The
  operator calls, and the CUDA calls under them, are in the Python call's trace, the top-level
  ones children of the innermost traced Python call open on the thread (one the python
  receiver's ``min_duration`` then leaves unrecorded leaves them without a recorded parent, as
  it does CUDA calls).
* otherwise (``steps: true``, the default): the step of its thread. A thread's top-level calls
  are grouped per step into one trace under a ``pytorch.step`` span (a :class:`~.events.TorchStep`
  event when the step ends), so a training run gives one trace per step, not one per operator
  call. A step begins at the first top-level call after the previous step ended and ends

  - at PyTorch's own step markers, record_function scopes probed on libtorch_cpu
    (``torch::autograd::profiler::record_function_enter_new`` / ``record_function_exit_new``):
    the exit of the outermost ``Optimizer.step#<Class>.step`` scope (every ``torch.optim``
    optimizer's ``step()``), or the entry of a ``ProfilerStep#<n>`` scope (``torch.profiler``
    run with a ``schedule``, at each ``prof.step()``);
  - on a thread that has shown no marker, at the first top-level call after ``step_gap`` (10 ms)
    with no top-level call running (a loop without an optimizer: steps split by the data
    loading, logging or sleep between them);
  - always, at the first top-level call once the step has been open ``step_max_duration``
    (10 s) or after ``step_max_ops`` (10,000) top-level calls: counted in
    ``otel_ebpf.torch.steps_cut{reason=max_duration|max_ops}``;
  - when its thread exits. A step still open when the agent stops gets its span from the calls
    seen (``pytorch.step.end_reason`` = ``open``).

  The ``pytorch.step`` span is made when the step ends (its operator spans as each call
  returns): the root of a gap-ended step arrives with the next step's first call. It runs from
  its first top-level call's entry to its last one's return (for an optimizer-ended step, the
  Optimizer.step scope's exit), with ``pytorch.step.seq`` (per thread, from 1),
  ``pytorch.step.ops`` (top-level calls), ``pytorch.step.end_reason`` (``optimizer``,
  ``profiler_step``, ``gap``, ``max_duration``, ``max_ops``, ``thread_exit``, ``open``) and
  ``thread.id``; the processor also records ``pytorch.step.duration``. Data loading before a
  step's first operator call is not in it. The markers need libtorch_cpu's symbol table
  (``record_function_exit_new`` is a local symbol; PyTorch's wheels keep it): without it the
  receiver warns and steps end by gaps and bounds only.
* ``steps: false``: the call itself (one trace per top-level call, as before).

The root is carried as a tagged time (``otel_ebpf.core.ids.TORCH_ROOT_PYTHON`` /
``TORCH_ROOT_STEP``), from which :func:`otel_ebpf.core.ids.op_ids` derives the trace id, so the
cuda processor puts a CUDA call under an operator in the same trace without knowing of steps.
"""
from __future__ import annotations

from otel_ebpf.core.pipeline import Consumer, Context, Factory

from .config import DEFAULT_OPS, Config
from .receiver import TorchReceiver

__all__ = ["DEFAULT_OPS", "Config", "TorchReceiver", "create", "factory"]


def create(config: Config, ctx: Context, next_: Consumer) -> TorchReceiver:
    return TorchReceiver(config, ctx, next_)


factory = Factory(type="torch", config_class=Config, create=create,
                  description="PyTorch operator calls (uprobes on libtorch_cpu at::_ops::<op>::call), nested "
                              "per thread", default_on=False)
