"""Configuration of the PyTorch receiver (``receivers: {torch: {...}}``)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from otel_ebpf.core.config import doc, key_path
from otel_ebpf.core.errors import ConfigError

__all__ = ["DEFAULT_OPS", "Config"]

# at::_ops struct names (the operator's name, plus its overload name when it has one: add.Tensor
# is add_Tensor, its in-place form add__Tensor). Chosen for a training step of common models:
# forward (linear/addmm/mm/bmm/matmul, convolution, relu, softmax, layer_norm, embedding, losses),
# backward (mm, convolution_backward, threshold_backward, the loss backwards) and SGD/Adam's
# in-place updates (add_, mul_).
DEFAULT_OPS = ["linear", "addmm", "mm", "bmm", "matmul", "convolution", "relu", "_softmax", "layer_norm",
               "embedding", "mse_loss", "cross_entropy_loss", "nll_loss_forward", "convolution_backward",
               "threshold_backward", "mse_loss_backward", "add__Tensor", "mul__Tensor"]
_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Config:
    """Every default lives here and is documented here."""

    ops: list[str] = doc(
        list(DEFAULT_OPS), "Operators to trace, as at::_ops struct names (operator name, '_' and the overload "
                           "name if any: add_.Tensor -> add__Tensor). Each costs two uprobes per call of it.")
    libraries: list[str] = doc(
        [], "Extra libtorch_cpu.so paths to probe, on top of those found per process (/proc/PID/maps, "
            "the traced command's Python environment) and those opened later (caught in the kernel).")
    min_duration: float = doc(
        0.0, "Only operator calls that lasted at least this long become spans (filtered in the kernel).",
        duration=True)
    max_depth: int = doc(
        16, "Nested operator calls kept per thread (a power of two, at most 256). Deeper ones are not "
            "recorded (reason=stack_too_deep).", pow2=True, max=256)
    max_threads: int = doc(
        4096, "Threads with an operator stack in the kernel at once. Beyond it new threads are not traced "
              "(reason=state_map_full).", min=1)
    steps: bool = doc(
        True, "Group top-level operator calls made outside traced Python calls into one trace per step of "
              "their thread, under a pytorch.step span (see the receiver's docs: step markers, gaps, bounds). "
              "false: one trace per top-level call.")
    step_gap: float = doc(
        0.01, "Idle time between two top-level calls that starts a new step on a thread that has shown no "
              "step marker (Optimizer.step#, ProfilerStep# record_function scopes).", duration=True, min=1e-6)
    step_max_duration: float = doc(
        10.0, "A step open longer than this ends at its next top-level call (reason max_duration, counted in "
              "otel_ebpf.torch.steps_cut).", duration=True, min=1e-3)
    step_max_ops: int = doc(
        10000, "A step ends after this many top-level calls (reason max_ops, counted in "
               "otel_ebpf.torch.steps_cut).", min=1)
    pause_on_load: bool = doc(
        True, "Stop (SIGSTOP) a traced process that opens libtorch_cpu.so until the probes are attached "
              "(about a second: the library's symbol table is read), then continue it. See receivers.cuda.")
    ringbuf_pages: int = doc(
        256, "Ring buffer size in pages. A full buffer drops records (reason=ringbuf_full).",
        pow2=True)
    poll_interval: float = doc(0.1, "Longest wait for ring-buffer records per poll round.", duration=True, min=0.001)

    def validate(self, path: str) -> None:
        if not self.ops:
            raise ConfigError(key_path(path, "ops"), "name at least one operator")
        for i, op in enumerate(self.ops):
            if not isinstance(op, str) or not _OP.match(op):
                raise ConfigError(f"{key_path(path, 'ops')}[{i}]", f"not an at::_ops name: {op!r}")
