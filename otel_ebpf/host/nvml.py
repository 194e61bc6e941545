"""Loading NVML through pynvml (nvidia-ml-py), and calling it without letting one failure spread.

:func:`load` initializes NVML or says, in one sentence, why it cannot (no driver library, driver
not loaded, no permission): the receiver turns that into its one warning line.

:class:`Calls` wraps every per-GPU call: a failure is counted in
``otel_ebpf.nvml.scrape.errors{function, error}`` (error = pynvml's class name without
``NVMLError_``: ``NotSupported``, ``FunctionNotFound``, ``GpuIsLost``...) and returns None, so a
scrape goes on with what it could read. A function the GPU or driver does not have
(NotSupported, FunctionNotFound, NoPermission) is remembered per GPU and not called again for
:data:`REPROBE_S` (MIG mode or a driver update can change the answer), so it costs one count, not
one per interval. ``GpuIsLost`` raises :class:`GpuLost`: the rest of that GPU's scrape is skipped.

Threading: NVML itself is thread-safe; a :class:`Calls` belongs to one thread.
"""
from __future__ import annotations

import ctypes
import time
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from otel_ebpf.core.telemetry import Telemetry

# the metric the nvml receiver declares (receivers/nvml/metrics.py); here so the loader needs no receiver
SCRAPE_ERRORS = "otel_ebpf.nvml.scrape.errors"


__all__ = ["FUNCTION_NOT_FOUND", "GPU_IS_LOST", "NOT_FOUND", "REPROBE_S", "Calls", "GpuLost", "error_name",
           "load"]

NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND, FUNCTION_NOT_FOUND, GPU_IS_LOST = 3, 4, 6, 13, 15
LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED = 12, 9
_ABSENT = frozenset((NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND))
REPROBE_S = 600.0


class GpuLost(Exception):
    """NVML answered GPU_IS_LOST: stop reading this GPU until the next scrape."""


def error_name(exc: BaseException) -> str:
    """``NotSupported`` for pynvml's NVMLError_NotSupported; the class name for anything else."""
    name = type(exc).__name__
    if name == "NVMLError":
        return f"NVML_{getattr(exc, 'value', 'error')}"
    return name.removeprefix("NVMLError_")


def load(library: str = "") -> tuple[ModuleType | None, str]:
    """Import pynvml and ``nvmlInit``. Returns (pynvml, "") or (None, why NVML cannot be used).

    ``library``: a libnvidia-ml.so.1 to use instead of the loader's: it is loaded first, so
    pynvml's ``CDLL("libnvidia-ml.so.1")`` finds it already mapped under that soname.
    Blocks for nvmlInit (milliseconds, up to seconds on a GPU without persistence mode).
    """
    try:
        import pynvml
    except ImportError as exc:
        return None, f"the nvidia-ml-py package is not installed ({exc})"
    if library:
        try:
            ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            return None, f"cannot load {library} (receivers.nvml.library): {exc}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code == LIBRARY_NOT_FOUND:
            return None, "libnvidia-ml.so.1 was not found (no NVIDIA driver on this host)"
        if code == DRIVER_NOT_LOADED:
            return None, "the NVIDIA kernel driver is not loaded (NVML: Driver Not Loaded)"
        return None, f"nvmlInit failed: {exc} ({error_name(exc)})"
    except Exception as exc:  # a broken library must not stop the agent
        return None, f"nvmlInit failed: {type(exc).__name__}: {exc}"
    return pynvml, ""


class Calls:
    """Counted, remembered pynvml calls for one receiver (see the module docstring)."""

    def __init__(self, nv: ModuleType, telemetry: Telemetry) -> None:
        self.nv = nv
        self._telemetry = telemetry
        self._absent: dict[tuple[str, str], tuple[float, int]] = {}  # (gpu, call) -> (when, NVML code)
        self.last_error: int | None = None

    def count(self, function: str, error: str) -> None:
        self._telemetry.add(SCRAPE_ERRORS, 1, function=function, error=error)

    def absent(self, gpu: str, function: str, *args: Any) -> bool:
        """True while ``function(*args)`` is remembered as missing on ``gpu``."""
        key = (gpu, _key(function, args))
        entry = self._absent.get(key)
        if entry is None:
            return False
        if time.monotonic() - entry[0] > REPROBE_S:
            del self._absent[key]
            return False
        self.last_error = entry[1]
        return True

    def call(self, gpu: str, function: str, *args: Any, quiet: tuple[int, ...] = ()) -> Any:
        """``pynvml.<function>(*args)``, or None when it failed (counted, unless its NVML error
        code is in ``quiet``). Raises GpuLost for GPU_IS_LOST. ``args[0]`` is the handle."""
        self.last_error = None
        if self.absent(gpu, function, *args):
            return None
        fn = getattr(self.nv, function, None)
        try:
            if fn is None:  # an older pynvml without this binding: same as a driver without it
                raise self.nv.NVMLError(FUNCTION_NOT_FOUND)
            return fn(*args)
        except self.nv.NVMLError as exc:
            code = self.last_error = getattr(exc, "value", None)
            if code in quiet:
                return None
            self.count(function, error_name(exc))
            if code == GPU_IS_LOST:
                raise GpuLost(function) from None
            if code in _ABSENT:
                self._absent[(gpu, _key(function, args))] = (time.monotonic(), code)
            return None
        except Exception as exc:  # ctypes or binding trouble: count and go on
            self.count(function, type(exc).__name__)
            return None

    def first(self, gpu: str, functions: Iterable[str], *args: Any) -> Any:
        """The first of ``functions`` the driver has (``_v3`` then ``_v2``...), or None."""
        for function in functions:
            result = self.call(gpu, function, *args)
            if result is not None or self.last_error != FUNCTION_NOT_FOUND:
                return result
        return None


def _key(function: str, args: tuple[Any, ...]) -> str:
    """The call without its handle: nvmlDeviceGetClockInfo:1 (SM) and :2 (memory) differ."""
    extra = [a for a in args[1:] if isinstance(a, (int, str))]
    return f"{function}:{','.join(map(str, extra))}" if extra else function
