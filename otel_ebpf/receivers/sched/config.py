"""Configuration of the sched receiver (``receivers: {sched: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc
from otel_ebpf.core.errors import ConfigError

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here."""

    stats_interval: float = doc(
        1.0, "How often the in-kernel per-process scheduler counters are turned into metrics "
             "(plus once at shutdown).", duration=True)
    sample_interval: float = doc(
        0.02, "How often the threads the NCCL processor asks about (those that call collectives) "
              "are sampled for the per-step host figures (ml.step.*); also the longest wait for "
              "ring-buffer records.", duration=True)
    lock_reason: bool = doc(
        True, "Tell a sleep inside futex() (a lock or condition variable) from other sleeps "
              "(off-CPU reason 'lock'). Costs a map lookup per futex() call on the host.")
    ringbuf_pages: int = doc(
        512, "Ring buffer size in pages (a power of two), for fork/exec/exit records. A full "
             "buffer drops records, counted as otel_ebpf.events.dropped{reason=ringbuf_full}.")
    max_threads: int = doc(
        65536, "Threads of traced processes whose scheduling state is kept in the kernel. Beyond "
               "it new threads are not accounted (reason=state_map_full).")
    max_processes: int = doc(
        8192, "Processes with in-kernel scheduler counters at once (freed after the process is "
              "gone and read). Beyond it new processes are not counted (reason=stats_map_full).")
    max_cpu_keys: int = doc(
        65536, "(process, CPU core) on-CPU counters in the kernel. Beyond it new pairs are not "
               "counted (reason=stats_map_full).")

    def validate(self, path: str) -> None:
        def where(key: str) -> str:
            return f"{path}.{key}" if path else key

        pages = self.ringbuf_pages
        if pages < 1 or pages & (pages - 1):
            raise ConfigError(where("ringbuf_pages"), f"must be a power of two, got {pages}")
        for key in ("max_threads", "max_processes", "max_cpu_keys"):
            if getattr(self, key) < 1:
                raise ConfigError(where(key), f"must be >= 1, got {getattr(self, key)}")
        if self.stats_interval < 0.01:
            raise ConfigError(where("stats_interval"), "must be at least 10ms")
        if self.sample_interval < 0.001:
            raise ConfigError(where("sample_interval"), "must be at least 1ms")
