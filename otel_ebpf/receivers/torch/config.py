"""Configuration of the PyTorch receiver (``receivers: {torch: {...}}``)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from otel_ebpf.core.config import doc
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
            "recorded (reason=stack_too_deep).")
    max_threads: int = doc(
        4096, "Threads with an operator stack in the kernel at once. Beyond it new threads are not traced "
              "(reason=state_map_full).")
    pause_on_load: bool = doc(
        True, "Stop (SIGSTOP) a traced process that opens libtorch_cpu.so until the probes are attached "
              "(about a second: the library's symbol table is read), then continue it. See receivers.cuda.")
    ringbuf_pages: int = doc(
        256, "Ring buffer size in pages (a power of two). A full buffer drops records (reason=ringbuf_full).")
    poll_interval: float = doc(0.1, "Longest wait for ring-buffer records per poll round.", duration=True)

    def validate(self, path: str) -> None:
        def where(key: str) -> str:
            return f"{path}.{key}" if path else key

        if not self.ops:
            raise ConfigError(where("ops"), "name at least one operator")
        for i, op in enumerate(self.ops):
            if not isinstance(op, str) or not _OP.match(op):
                raise ConfigError(f"{where('ops')}[{i}]", f"not an at::_ops name: {op!r}")
        d = self.max_depth
        if d < 1 or d > 256 or d & (d - 1):
            raise ConfigError(where("max_depth"), f"must be a power of two from 1 to 256, got {d}")
        pages = self.ringbuf_pages
        if pages < 1 or pages & (pages - 1):
            raise ConfigError(where("ringbuf_pages"), f"must be a power of two, got {pages}")
        if self.max_threads < 1:
            raise ConfigError(where("max_threads"), f"must be >= 1, got {self.max_threads}")
        if self.poll_interval < 0.001:
            raise ConfigError(where("poll_interval"), "must be at least 1ms")
