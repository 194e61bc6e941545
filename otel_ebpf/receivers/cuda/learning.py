"""The current device of threads that chose theirs before the agent attached.

CUDA's current device is per host thread, and the cuda program learns it from each successful cudaSetDevice
(``thread_device``). A process that was already running when the agent attached (``run --pid``,
``--all-processes``, an agent restart under a running job) made its cudaSetDevice unseen, so every one of its
threads would read as device 0, CUDA's default: wrong ``cuda.device.index`` and ``hw.id`` on all but LOCAL_RANK
0. For ``learn_device_for`` seconds after such an attach, cudaGetDevice is probed on the runtimes those processes
map: its successful return writes the thread's device (cuda.bpf.c get_device_return), and a thread whose device
is known skips at entry. PyTorch asks on nearly every operator (c10::cuda::current_device -> GetDevice ->
cudaGetDevice), so a busy thread is learned within its first step. Then the probe is detached: a uretprobe costs
every caller a second probe hit (~0.6-1 us each on this project's VMs), which is not worth paying for the
life of the job.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from otel_ebpf.bpf.receiver import Probe
from otel_ebpf.host.libraries import mapped_libraries

__all__ = ["LEARN_PROBE", "DeviceLearning"]

log = logging.getLogger(__name__)

LEARN_PROBE = Probe("cudaGetDevice", entry="enter_cudaGetDevice", ret="return_cudaGetDevice", optional=True)


class DeviceLearning:
    """Attaches :data:`LEARN_PROBE` to the runtimes of processes already running, and detaches it after
    ``seconds``. ``begin`` once the program is loaded; ``poll`` from the receiver's poll loop; ``end`` at
    shutdown (or when the window is over). ``attach(path, probe)`` -> (probes attached, error or None) and
    ``detach(path, symbol, ret)`` are the receiver's (BpfReceiver._attach_one, detach_uprobe);
    ``attach_lock`` guards its attaches (BCC's are not thread-safe)."""

    def __init__(self, seconds: float, attach: Callable[[str, Probe], tuple[int, str | None]],
                 detach: Callable[[str, str, bool], None], attach_lock: threading.Lock) -> None:
        self.seconds, self._attach, self._detach, self._attach_lock = seconds, attach, detach, attach_lock
        self.paths: list[str] = []
        self.deadline = 0.0
        self._lock = threading.Lock()

    def begin(self, pids: Iterable[int]) -> list[str]:
        """Attach to every libcudart that one of ``pids`` (alive now) maps; returns the paths attached to."""
        if self.seconds <= 0:
            return []
        mapped = {pid: libs for pid in pids if (libs := mapped_libraries(pid, "libcudart"))}  # one maps read each
        running, paths = list(mapped), sorted({path for libs in mapped.values() for path in libs})
        attached = []
        with self._attach_lock:
            for path in paths:
                n, error = self._attach(path, LEARN_PROBE)
                if n == 2:
                    attached.append(path)
                elif error is not None:
                    log.info("cuda: cannot learn devices from %s: %s", path, error)
        with self._lock:
            self.paths = attached
            self.deadline = time.monotonic() + self.seconds
        if attached:
            log.info("cuda: %d process(es) were running before the agent attached; learning their threads' "
                     "devices from cudaGetDevice for %.0f s", len(running), self.seconds)
        return attached

    def poll(self) -> None:
        """End the window once it is over."""
        if self.paths and time.monotonic() >= self.deadline:
            self.end()

    def end(self) -> None:
        """Detach the probe from every library it is on (threads not learned by now stay on device 0)."""
        with self._lock:
            paths, self.paths = self.paths, []
        if not paths:
            return
        with self._attach_lock:
            for path in paths:
                for ret in (False, True):
                    try:
                        self._detach(path, LEARN_PROBE.symbol, ret)
                    except Exception:  # the library may be gone with its last process
                        log.debug("cuda: detaching cudaGetDevice from %s failed", path, exc_info=True)
        log.debug("cuda: device learning over (%s)", ", ".join(paths))
