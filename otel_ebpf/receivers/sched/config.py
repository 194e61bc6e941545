"""Configuration of the sched receiver (``receivers: {sched: {...}}``).

``ringbuf_pages`` moved to ``receivers.lifecycle`` with the fork/exec/exit records it sized: an old
config that sets ``receivers.sched.ringbuf_pages`` is refused as an unknown key (docs/receivers.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    stats_interval: float = doc(
        1.0, "How often the in-kernel per-process scheduler counters are turned into metrics "
             "(plus once at shutdown).", duration=True, min=0.01)
    sample_interval: float = doc(
        0.02, "How often the threads the NCCL processor asks about (those that call collectives) "
              "are sampled for the per-step host figures (ml.step.*).", duration=True, min=0.001)
    lock_reason: bool = doc(
        True, "Tell a sleep inside futex() (a lock or condition variable) from other sleeps "
              "(off-CPU reason 'lock'). Costs a map lookup per futex() call on the host.")
    max_threads: int = doc(
        65536, "Threads of traced processes whose scheduling state is kept in the kernel. Beyond "
               "it new threads are not accounted (reason=state_map_full).", min=1)
    max_processes: int = doc(
        8192, "Processes with in-kernel scheduler counters at once (freed after the process is "
              "gone and read). Beyond it new processes are not counted (reason=stats_map_full).", min=1)
    max_cpu_keys: int = doc(
        65536, "(process, CPU core) on-CPU counters in the kernel. Beyond it new pairs are not "
               "counted (reason=stats_map_full).", min=1)

    def validate(self, path: str) -> None:
        """Nothing to check beyond types and the bounds declared on the fields (otel_ebpf.core.config)."""
