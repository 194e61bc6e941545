"""Configuration of the Python receiver (``receivers: {python: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc
from otel_ebpf.core.errors import ConfigError

__all__ = ["MAX_PREFIXES", "PREFIX_LEN", "Config"]

MAX_PREFIXES = 8
PREFIX_LEN = 128  # python.bpf.c PY_PREFIX_LEN (= PY_FILE_LEN)


@dataclass
class Config:
    """Every default lives here and is documented here."""

    interpreter: str = doc(
        "", "Path of the Python interpreter (or libpython3.X.so) whose USDT probes are used. Empty: the "
            "traced command's interpreter (resolving a '#!' line), else the first traced process's "
            "executable. One interpreter build per agent: its argument locations are compiled in.")
    min_duration: float = doc(
        0.001, "Only calls that lasted at least this long become spans (filtered in the kernel).",
        duration=True)
    path_prefixes: list[str] = doc(
        [], "Only calls of code whose file name (co_filename) starts with one of these become spans "
            f"(at most {MAX_PREFIXES}, each under {PREFIX_LEN} bytes; matched in the kernel). Empty: all.")
    max_depth: int = doc(
        128, "Frames kept per thread (a power of two, at most 256; 40 bytes each, allocated per thread on "
             "its first call). Calls deeper are not recorded, counted as "
             "otel_ebpf.events.dropped{reason=stack_too_deep} (importing a large package nests ~60 deep).")
    max_threads: int = doc(
        4096, "Threads with a call stack in the kernel at once (each 40 bytes per max_depth frame). "
              "Beyond it new threads are not traced (reason=state_map_full).")
    max_processes: int = doc(
        64, "Processes the probes are attached to at once (two uprobes each). Beyond it new processes "
            "are not traced (reason=too_many_processes).")
    ringbuf_pages: int = doc(
        256, "Ring buffer size in pages (a power of two). A full buffer drops records "
             "(reason=ringbuf_full).")
    poll_interval: float = doc(0.1, "Longest wait for ring-buffer records per poll round.", duration=True)

    def validate(self, path: str) -> None:
        def where(key: str) -> str:
            return f"{path}.{key}" if path else key

        if len(self.path_prefixes) > MAX_PREFIXES:
            raise ConfigError(where("path_prefixes"), f"at most {MAX_PREFIXES} prefixes, got {len(self.path_prefixes)}")
        for i, p in enumerate(self.path_prefixes):
            if not isinstance(p, str) or not p or len(p.encode()) >= PREFIX_LEN:
                raise ConfigError(f"{where('path_prefixes')}[{i}]", f"must be a non-empty string under "
                                  f"{PREFIX_LEN} bytes, got {p!r}")
        d = self.max_depth
        if d < 1 or d > 256 or d & (d - 1):
            raise ConfigError(where("max_depth"), f"must be a power of two from 1 to 256, got {d}")
        pages = self.ringbuf_pages
        if pages < 1 or pages & (pages - 1):
            raise ConfigError(where("ringbuf_pages"), f"must be a power of two, got {pages}")
        for key in ("max_threads", "max_processes"):
            if getattr(self, key) < 1:
                raise ConfigError(where(key), f"must be >= 1, got {getattr(self, key)}")
        if self.poll_interval < 0.001:
            raise ConfigError(where("poll_interval"), "must be at least 1ms")
