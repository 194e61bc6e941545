"""Configuration of the Python receiver (``receivers: {python: {...}}``)."""
from __future__ import annotations

from dataclasses import dataclass

from otel_ebpf.core.config import doc, key_path
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
             "otel_ebpf.events.dropped{reason=stack_too_deep} (importing a large package nests ~60 deep).",
        pow2=True, max=256)
    max_threads: int = doc(
        4096, "Threads with a call stack in the kernel at once (each 40 bytes per max_depth frame). "
              "Beyond it new threads are not traced (reason=state_map_full).", min=1)
    max_processes: int = doc(
        64, "Processes the probes are attached to at once (two uprobes each). Beyond it new processes "
            "are not traced (reason=too_many_processes).", min=1)
    ringbuf_pages: int = doc(
        256, "Ring buffer size in pages. A full buffer drops records "
             "(reason=ringbuf_full).", pow2=True)
    profile_hook: bool = doc(
        False, "run -- CMD only: start the command with a do-nothing profile function in every Python process "
               "it runs (a sitecustomize put first on PYTHONPATH, chaining to the one it shadows). CPython 3.11 "
               "to 3.14 fire the function entry probe only while one is set (gh-98894): without it no call is "
               "timed. Costs ~0.1 us per Python call on top of the probes' ~1.5 us; other versions are left alone.")
    poll_interval: float = doc(0.1, "Longest wait for ring-buffer records per poll round.", duration=True, min=0.001)

    def validate(self, path: str) -> None:
        if len(self.path_prefixes) > MAX_PREFIXES:
            raise ConfigError(key_path(path, "path_prefixes"),
                              f"at most {MAX_PREFIXES} prefixes, got {len(self.path_prefixes)}")
        for i, p in enumerate(self.path_prefixes):
            if not isinstance(p, str) or not p or len(p.encode()) >= PREFIX_LEN:
                raise ConfigError(f"{key_path(path, 'path_prefixes')}[{i}]", f"must be a non-empty string under "
                                  f"{PREFIX_LEN} bytes, got {p!r}")
