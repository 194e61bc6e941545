"""Configuration of the CUDA processor (``processors: {cuda: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    max_tracked_allocations: int = doc(
        65536, "Outstanding device allocations remembered at once, over all processes (about "
               "150 bytes each). Beyond it new allocations are not tracked: they count in "
               "gpu.cuda.memory.allocations but not in the outstanding/leaked metrics, and each "
               "is counted as otel_ebpf.events.dropped{reason=alloc_table_full}.", min=1)
    kernel_name_limit: int = doc(
        50, "Kernel names per process that get their own gpu.cuda.kernel.launch.calls series "
            "(cuda.kernel.name); launches of further kernels are counted as cuda.kernel.name=other. A name "
            "admitted keeps its series; the busiest kernels of the first stats reads are admitted first. "
            "0: no cuda.kernel.name on metrics.", min=0, max=10000)
    spans: bool = doc(True, "Emit a span per memcpy, malloc/free, synchronize and cudaSetDevice "
                            "call (metrics are emitted either way).")

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
