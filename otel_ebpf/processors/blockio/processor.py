"""Block IO events (otel_ebpf/receivers/blockio) -> MetricRecords; everything else passes unchanged.

Metrics (scope ``otel_ebpf.blockio``). Device metrics are on the agent's resource (pid None),
per-process metrics on the traced process's resource. Attributes: ``system.device`` (``vda``),
and ``disk.io.direction`` (``read``/``write``, semconv) for reads and writes; other operations
carry ``disk.io.operation`` (``discard``, ``flush``, ``other``; otel-ebpf's own, no semconv).

* ``system.disk.io`` counter By, ``system.disk.operations`` counter {operation},
  ``system.disk.operation_time`` counter s (sum of issue-to-completion times): semconv.
* ``system.disk.operation.duration`` histogram s: the latency of each request, from the
  in-kernel log2 histogram (each request is recorded at its bucket's midpoint, 1.5 x 2^(s-1)
  us; below 1 us as 0.5 us). No semconv name exists for a disk latency histogram.
* ``process.disk.io`` counter By and ``process.disk.operations`` counter {operation}
  (semconv), ``process.disk.operation_time`` counter s (otel-ebpf's, mirrors the system one):
  requests the process inserted or issued, with ``system.device``.

Threading: single-threaded (the pipeline worker calls ``consume``); ``consume`` never raises.
"""
from __future__ import annotations

from typing import Any

from otel_ebpf.core.processing import EventProcessor, MetricSpec, handles

from ...receivers.blockio.events import DiskIoStats, ProcessDiskIo
from .config import Config

__all__ = ["METRICS", "SCOPE", "BlockIoProcessor", "bucket_seconds", "io_attributes"]

SCOPE = "otel_ebpf.blockio"
# name -> (kind, unit, description)
METRICS: dict[str, MetricSpec] = {
    "system.disk.io": ("counter", "By", "Bytes read from and written to the device."),
    "system.disk.operations": ("counter", "{operation}", "Completed block requests."),
    "system.disk.operation_time": ("counter", "s", "Sum of the time each request took, issue to completion."),
    "system.disk.operation.duration": ("histogram", "s", "Time each block request took, issue to completion."),
    "process.disk.io": ("counter", "By", "Bytes of block requests the process issued."),
    "process.disk.operations": ("counter", "{operation}", "Block requests the process issued."),
    "process.disk.operation_time": ("counter", "s", "Sum of the device time of the process's block requests."),
}


def io_attributes(device: str, op: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {"system.device": device}
    if op in ("read", "write"):
        attrs["disk.io.direction"] = op
    else:
        attrs["disk.io.operation"] = op
    return attrs


def bucket_seconds(slot: int) -> float:
    """The midpoint of log2 bucket ``slot`` ([2^(slot-1), 2^slot) us), in seconds."""
    return 0.5e-6 if slot == 0 else 1.5 * (1 << (slot - 1)) * 1e-6


class BlockIoProcessor(EventProcessor[Config]):
    """Processor ``blockio``: stateless."""

    NAME = "blockio"
    SCOPE = SCOPE
    METRICS = METRICS

    @handles(DiskIoStats)
    def _device(self, ev: DiskIoStats, out: list[object]) -> None:
        attrs = io_attributes(ev.device, ev.op)
        self.metric(out, None, "system.disk.io", ev.bytes, attrs)
        self.metric(out, None, "system.disk.operations", ev.ops, attrs)
        self.metric(out, None, "system.disk.operation_time", ev.ns / 1e9, attrs)
        if self.config.latency_histogram:
            for slot, count in ev.buckets:
                self.metric(out, None, "system.disk.operation.duration", bucket_seconds(slot), attrs, count)

    @handles(ProcessDiskIo)
    def _process(self, ev: ProcessDiskIo, out: list[object]) -> None:
        attrs = io_attributes(ev.device, ev.op)
        self.metric(out, ev.pid, "process.disk.io", ev.bytes, attrs)
        self.metric(out, ev.pid, "process.disk.operations", ev.ops, attrs)
        self.metric(out, ev.pid, "process.disk.operation_time", ev.ns / 1e9, attrs)
