"""XID errors through NVML's event API, in a thread of their own.

``nvmlEventSetCreate`` + ``nvmlDeviceRegisterEvents(gpu, nvmlEventTypeXidCriticalError)`` for
every GPU, then ``nvmlEventSetWait_v2`` in a loop: the call blocks in the driver until an event
arrives or ``wait_s`` passes (so an event is delivered at once, and shutdown waits at most
``wait_s``; nothing is polled). Each event becomes an :class:`XidError` handed to ``on_error``.
A GPU that cannot deliver XID events (NotSupported) is counted in
``otel_ebpf.nvml.scrape.errors`` and left out; with none left the watcher does not run.
"""
from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_ebpf.host.nvml import Calls, error_name

__all__ = ["XID_MEANINGS", "XidError", "XidWatcher"]

log = logging.getLogger(__name__)
_TIMEOUT = 10  # NVML_ERROR_TIMEOUT

#: A few common XIDs, for the warning line (NVIDIA's "XID Errors" catalog has them all).
XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup after a previous error", 48: "double-bit ECC error",
    63: "ECC page retirement or row remapping", 64: "ECC page retirement or row remapping failure",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
}


@dataclass(frozen=True, slots=True)
class XidError:
    """NVML reported XID ``xid`` on the GPU ``uuid`` (``time_ns``: when the agent received it)."""

    uuid: str
    xid: int
    time_ns: int


class XidWatcher:
    """Owns one NVML event set. ``run`` blocks until ``stop`` is set; ``close`` frees the set
    (call it after ``run`` returned, before nvmlShutdown)."""

    def __init__(self, calls: Calls, handles: Mapping[str, Any], on_error: Callable[[XidError], None],
                 wait_s: float) -> None:
        self._calls = calls
        self._nv = calls.nv
        self._on_error = on_error
        self._wait_ms = max(int(wait_s * 1000), 1)
        self._by_address: dict[int | None, str] = {}
        self._set: Any = self._calls.call("system", "nvmlEventSetCreate")
        if self._set is None:
            return
        for uuid, handle in handles.items():
            try:
                self._nv.nvmlDeviceRegisterEvents(handle, self._nv.nvmlEventTypeXidCriticalError, self._set)
            except self._nv.NVMLError as exc:
                self._calls.count("nvmlDeviceRegisterEvents", error_name(exc))
                continue
            self._by_address[_address(handle)] = uuid

    @property
    def active(self) -> bool:
        """True when at least one GPU delivers XID events to this set."""
        return self._set is not None and bool(self._by_address)

    def run(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set() and self.active:
            try:
                data = self._nv.nvmlEventSetWait_v2(self._set, self._wait_ms)
            except self._nv.NVMLError as exc:
                if getattr(exc, "value", None) == _TIMEOUT:
                    failures = 0
                    continue
                self._calls.count("nvmlEventSetWait_v2", error_name(exc))
                failures += 1
                # A broken event set answers at once: do not spin on it.
                stop.wait(min(0.1 * 2 ** failures, 30.0))
                continue
            if data.eventType & self._nv.nvmlEventTypeXidCriticalError:
                uuid = self._by_address.get(_address(data.device)) or "unknown"
                self._on_error(XidError(uuid, int(data.eventData), time.time_ns()))

    def close(self) -> None:
        if self._set is not None:
            try:
                self._nv.nvmlEventSetFree(self._set)
            except Exception:  # shutting down: nothing left to do about it
                log.debug("nvmlEventSetFree failed", exc_info=True)
            self._set = None


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value
