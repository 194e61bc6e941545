"""What components use of the services the Agent shares through :class:`~otel_ebpf.core.pipeline.Context`.

Whoever builds a Context (the Agent, the Python API's Session, a test) makes each service once
and puts it there; components use it only through the methods below. They are structural
(``typing.Protocol``): the classes that implement them live in higher layers and need not
name them, and the core imports none of them.

=================  ====================================================  ==========================
Context field      implemented by                                        used by
=================  ====================================================  ==========================
``clock``          ``otel_ebpf.bpf.clock.KernelClock``                   every BPF receiver
``resources``      ``otel_ebpf.host.processes.ResourceCache``            BPF receivers, gpus
``gpus``           ``otel_ebpf.host.gpus.GpuResolver``                   cuda, nccl processors
``host_stats``     ``otel_ebpf.host.timeline.HostStats``                 host receivers, nccl proc.
``app_context``    ``otel_ebpf.receivers.apptrace.store.AppContextStore``  apptrace recv., cuda proc.
``cuda_threads``   ``otel_ebpf.receivers.cuda.CudaReceiver`` (running)    nccl processor
=================  ====================================================  ==========================

Thread safety: every service is called from receiver threads and the pipeline worker at once,
so each implementation is thread-safe and never raises from these methods (hot paths).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

__all__ = ["AppContext", "CudaThreads", "GpuTable", "HostTimeline", "KernelTime", "ProcessResources"]


class KernelTime(Protocol):
    """Kernel monotonic time (``bpf_ktime_get_ns()``) to Unix epoch ns. One per agent, so every
    receiver converts a kernel time one program shares with another to the same epoch ns."""

    offset_ns: int  # epoch ns - monotonic ns

    def to_epoch_ns(self, monotonic_ns: int) -> int: ...

    def now_monotonic_ns(self) -> int: ...

    def check(self) -> int: ...  # the wall clock's step found since the last check, in ns (0: none, or not found here)


class ProcessResources(Protocol):
    """Process identity (``process.*``, container, pod attributes), cached per (pid, start time):
    receivers read it as soon as a process is seen, while /proc/PID still describes it."""

    def get(self, pid: int, fallback_comm: str | None = None) -> Mapping[str, object]:
        """Attributes of ``pid`` (read from /proc on the first call)."""
        ...

    def environment(self, pid: int) -> tuple[dict[str, str], bool] | None:
        """``pid``'s environment as read with its identity, and whether it was cut short; None:
        unreadable."""
        ...

    def refresh(self, pid: int, exec_ns: int | None = None) -> None:
        """Read ``pid`` again (exec: same pid and start time, another program); keep what was read
        when it is gone. ``exec_ns``: when the exec happened (CLOCK_MONOTONIC): skip when the entry was
        read after it (another receiver's refresh of the same exec)."""
        ...

    def evict(self, pid: int) -> None:
        """Forget ``pid``."""
        ...

    def hint(self, pid: int, time_ns: int, *, ppid: int | None = None, filename: str | None = None,
             argv: Sequence[str] | None = None) -> None:
        """What the kernel reported of ``pid`` (its fork with ``ppid``, or its exec of ``filename`` with
        ``argv``, at kernel monotonic ``time_ns``), used only where ``/proc/PID`` could not be read in time
        (a short-lived process); redacted as /proc content is. Never raises."""
        ...


class GpuTable(Protocol):
    """A process's CUDA device ordinal -> the GPU's ``hw.id`` (its UUID)."""

    def hw_id(self, pid: int, ordinal: int) -> str | None:
        """The UUID of ``pid``'s device ``ordinal`` (-1: unknown), or None when it cannot be known."""
        ...

    def forget(self, pid: int) -> None:
        """Drop the answers for ``pid`` (its process exited)."""
        ...


class HostTimeline(Protocol):
    """Cumulative host counters per (pid, tid) over time: receivers push samples, processors ask
    for the increase over an interval (otel_ebpf.host.timeline has the interpolation rules)."""

    def add(self, pid: int, time_ns: int, *, tid: int = 0, growing: str = "", **counters: float) -> None:
        """Cumulative ``counters`` of ``pid`` (thread ``tid``; 0: the process) at ``time_ns``;
        ``growing``: the counter rising at 1 ns per ns at that time (a thread's state), if any."""
        ...

    def delta(self, pid: int, start_ns: int, end_ns: int, *, tid: int = 0) -> dict[str, float]:
        """Each counter's increase over [start_ns, end_ns]; {} when none is known."""
        ...

    def watch(self, pid: int, tid: int) -> None:
        """Ask the feeders to sample thread ``tid`` from now on."""
        ...

    def set_sampler(self, sampler: Callable[[int, int], None] | None) -> None:
        """A feeder's reader of one thread's counters now (``sampler(pid, tid)``), or None."""
        ...

    def fresh(self, pid: int, tid: int, time_ns: int) -> None:
        """Have thread ``tid`` sampled now if its newest sample is older than ``time_ns`` and a
        feeder can read it on demand."""
        ...

    def watched(self) -> list[tuple[int, int]]:
        """The (pid, tid) threads asked about, for the feeders."""
        ...

    def forget(self, pid: int) -> None:
        """Drop every series and watch of ``pid`` (the process is gone)."""
        ...


class AppContext(Protocol):
    """The application span current on a thread at a time (from the app's own tracing SDK)."""

    def begin(self, pid: int, tid: int, start_ns: int, trace_id: int, span_id: int) -> None: ...

    def end(self, pid: int, tid: int, span_id: int, end_ns: int) -> None: ...

    def lookup(self, pid: int, tid: int, time_ns: int) -> tuple[int, int] | None:
        """(trace_id, span_id) of the innermost app span of ``tid`` containing ``time_ns``."""
        ...


class CudaThreads(Protocol):
    """A host thread's current CUDA device, as the CUDA runtime of its process has it now."""

    def device_of(self, pid: int, tid: int) -> int | None:
        """The ordinal thread ``tid`` of ``pid`` is on (0, CUDA's default, when it never set one), or None
        when it cannot be known (that process's CUDA runtime is not probed)."""
        ...
