"""Per-process GPU memory and utilization, as records on each process's own resource.

For one GPU: ``nvmlDeviceGetComputeRunningProcesses_v3`` and ``...GraphicsRunningProcesses_v3``
(``_v2`` on drivers without v3; both fill pynvml's ``c_nvmlProcessInfo_v2_t``: pid, used memory,
GPU/compute instance ids) give each process's used memory; ``nvmlDeviceGetProcessUtilization``
gives SM / memory / encoder / decoder utilization samples newer than the last one seen (NVML
answers NOT_FOUND when there is none: not an error), averaged per process. Records:

* ``hw.gpu.memory.usage`` (updown, By) with the GPU's attributes and ``pid`` = the process.
* ``hw.gpu.utilization`` {hw.gpu.task=general|encoder|decoder} and ``nvidia.gpu.memory.activity``
  (gauges, 0..1): the mean of the samples since the last scrape, 0 for a process on the GPU
  without a new sample (NVML has none for a process that did not run on the GPU).

The process's resource (``otel_ebpf.host.processes.ResourceCache``) carries ``k8s.pod.name`` and the other
``k8s.*`` names of its pod, so these series sum by pod (PromQL in docs/nvml.md).

A process that leaves the GPU while still alive gets its memory brought back to 0; one that
exited is simply forgotten (the emitter releases its resource). PIDs are as NVML reports them:
the host's PID namespace, which is where the agent runs.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from otel_ebpf.core.events import MetricRecord

from . import metrics as m
from otel_ebpf.host.nvml import NOT_FOUND, Calls
from otel_ebpf.host.procfs import process_gone

if TYPE_CHECKING:
    from .scrape import Gpu, Scraper

__all__ = ["ProcessReader"]

_RUNNING = (("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
            ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"))
_TASKS = (("general", "smUtil"), ("encoder", "encUtil"), ("decoder", "decUtil"))
_MEMBERS = ("smUtil", "memUtil", "encUtil", "decUtil")


class ProcessReader:
    """The per-process part of one GPU's scrape. ``want(pid)``: emit series for this process."""

    def __init__(self, calls: Calls, uuid: str, handle: Any, want: Callable[[int], bool]) -> None:
        self._calls = calls
        self._uuid = uuid
        self._handle = handle
        self._want = want
        self._last_sample_us = 0
        self._pids: set[int] = set()

    def _used(self) -> dict[int, int]:
        used: dict[int, int] = {}
        for functions in _RUNNING:
            for p in self._calls.first(self._uuid, functions, self._handle) or ():
                if p.usedGpuMemory is not None:  # None: not available (WDDM)
                    used[p.pid] = max(used.get(p.pid, 0), int(p.usedGpuMemory))
        return used

    def _samples(self) -> dict[int, dict[str, float]]:
        """{pid: {smUtil, memUtil, encUtil, decUtil: mean percent}} over the new samples."""
        samples = self._calls.call(self._uuid, "nvmlDeviceGetProcessUtilization", self._handle,
                                   self._last_sample_us, quiet=(NOT_FOUND,)) or ()
        sums: dict[int, list[float]] = {}
        for s in samples:
            acc = sums.setdefault(s.pid, [0.0, 0.0, 0.0, 0.0, 0.0])
            for i, member in enumerate(_MEMBERS):
                acc[i] += getattr(s, member)
            acc[4] += 1
            self._last_sample_us = max(self._last_sample_us, int(s.timeStamp))
        return {pid: {member: acc[i] / acc[4] for i, member in enumerate(_MEMBERS)} for pid, acc in sums.items()}

    def read(self, scraper: Scraper, gpu: Gpu, out: list[MetricRecord]) -> None:
        used, samples = self._used(), self._samples()
        pids = {pid for pid in used.keys() | samples.keys() if self._want(pid)}
        for pid in pids:
            self._emit(scraper, gpu, out, pid, used.get(pid), samples.get(pid))
        for pid in self._pids - pids:  # left the GPU: back to 0 if still alive, else forgotten
            if not process_gone(pid):
                self._emit(scraper, gpu, out, pid, 0, None)
            scraper.deltas.last.pop((pid, "hw.gpu.memory.usage", tuple(sorted(gpu.attrs.items()))), None)
        self._pids = pids

    @staticmethod
    def _emit(scraper: Scraper, gpu: Gpu, out: list[MetricRecord], pid: int, used: int | None,
              mean: dict[str, float] | None) -> None:
        if used is not None:
            scraper.emit(out, "hw.gpu.memory.usage", used, gpu.attrs, pid=pid)
        mean = mean or {}
        for task, member in _TASKS:
            scraper.emit(out, "hw.gpu.utilization", mean.get(member, 0.0) / 100, {**gpu.attrs, m.HW_TASK: task},
                         pid=pid)
        scraper.emit(out, "nvidia.gpu.memory.activity", mean.get("memUtil", 0.0) / 100, gpu.attrs, pid=pid)
