"""Configuration of the nccl_watch processor (``processors: {nccl_watch: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc
from otel_ebpf.core.errors import ConfigError

__all__ = ["Config"]


@dataclass
class Config:
    """Every default lives here and is documented here. A process is silent when its last NCCL call
    (any communicator) ended longer ago than min(max_silence, max(min_silence, silence_factor x its
    longest recent gap between two calls)); the gap is remembered as a maximum that halves every
    gap_half_life, so a long eval or checkpoint pause raises the threshold for a while, not forever."""

    min_silence: float = doc(
        10.0, "Shortest silence that counts: with the 1s tick, a hung rank's stack is captured 10-11s after "
              "its last NCCL call (issue 17 asks for <= 15s).", duration=True, min=1, max=3600)
    max_silence: float = doc(
        300.0, "Longest threshold, whatever pauses the process made before: a hang is caught within this "
               "even after a long checkpoint pause.", duration=True, min=1, max=86400)
    silence_factor: float = doc(
        3.0, "The threshold is this many times the process's longest recent gap between two NCCL calls "
             "(steps of 4s: 12s).", min=1, max=1000)
    gap_half_life: float = doc(
        600.0, "How fast a long gap is forgotten: the remembered longest gap halves every this long.",
        duration=True, min=1, max=86400)
    min_interval: float = doc(
        30.0, "Least time between two captures of one process. While one silence lasts the wait doubles "
              "after each capture (30s, 60s, 120s... up to max_interval), so a 10-minute hang costs 5 "
              "captures, not 20; a silence that starts before min_interval has passed since the last capture "
              "is counted as suppressed (otel_ebpf.nccl.stack.suppressed{reason=rate_limit}).",
        duration=True, min=1, max=86400)
    max_interval: float = doc(600.0, "Longest wait between two captures of one silent process.",
                              duration=True, min=1, max=86400)
    max_bytes_per_minute: int = doc(
        1 << 20, "Stack bytes exported per minute at most (bodies, each record counted; a token bucket). "
                 "A capture due while it is spent is suppressed (reason byte_budget) and tried again after "
                 "min_interval.", min=1024)
    max_stack_bytes: int = doc(
        16384, "Longest text stack of one capture (UTF-8 bytes); the rest is cut, said by "
               "otel_ebpf.stack.truncated.", min=256, max=1 << 20)
    max_frames: int = doc(64, "Frames kept per thread, innermost first.", min=1, max=4096)
    max_threads: int = doc(64, "Threads kept per capture (main thread first in the text).", min=1, max=4096)
    native: bool = doc(
        False, "Add native (C/C++) frames. py-spy then stops the process while it reads (a few ms; never "
               "past capture_timeout), and symbolizing big libraries such as libtorch makes a capture slower. "
               "Off: py-spy only reads memory and never stops the process.")
    capture_timeout: float = doc(
        2.0, "Longest one capture may take; then py-spy is killed (outcome timeout).", duration=True,
        min=0.05, max=60)
    max_processes: int = doc(
        1024, "Processes watched at once; beyond it the one whose last call is oldest is forgotten "
              "(otel_ebpf.events.dropped{receiver=nccl_watch, reason=rank_table_full}).", min=1)
    max_comms_per_process: int = doc(
        16, "Communicators remembered per process (one record each per capture); beyond it the least "
            "recently used is forgotten (reason comm_table_full).", min=1, max=4096)
    max_queue: int = doc(
        8, "Captures waiting for the capture thread; beyond it a capture is dropped (reason "
           "capture_queue_full) and tried again after min_interval.", min=1, max=4096)

    def validate(self, path: str) -> None:
        """The silence and interval ranges must not be upside down."""
        if self.min_silence > self.max_silence:
            raise ConfigError(f"{path}.min_silence", f"must be <= max_silence ({self.max_silence:g}s), "
                                                     f"got {self.min_silence:g}s")
        if self.min_interval > self.max_interval:
            raise ConfigError(f"{path}.min_interval", f"must be <= max_interval ({self.max_interval:g}s), "
                                                      f"got {self.min_interval:g}s")
