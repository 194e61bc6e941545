"""One NVML scrape: every GPU read through pynvml into :class:`~otel_ebpf.core.events.MetricRecord` s.

Per GPU, in this order (each call counted and skipped on failure, see :mod:`.nvml`):
utilization (gpu, memory), memory info, temperature, power usage, energy and enforced limit, fan, SM and
memory clocks, encoder/decoder utilization, PCIe (byte counters through field values where the
driver has them, else the 20 ms throughput sample), volatile ECC totals and PCIe replays, clocks event (throttle)
reasons, NVLink link state and data counters, MIG mode and instances, and the processes on the
GPU with their memory and utilization. GPU series go on the agent's resource (``pid`` None);
per-process series carry the process's ``pid``, so the emitter puts them on the same resource as
that process's eBPF spans.

``updown`` and ``counter`` records are deltas (the emitter adds them up): NVML's absolute values
(memory used, cumulative ECC and byte counters) are turned into differences here, per series.

A GPU answering GPU_IS_LOST is skipped for the rest of that scrape (``hw.status{hw.state=failed}``
goes to 1); the other GPUs are read as usual. A GPU whose identity cannot be read is retried at
the next scrape. Each GPU's scrape time is recorded as ``otel_ebpf.nvml.scrape.duration`` and
kept in :attr:`Scraper.durations`.

Threading: one thread (the receiver's scrape thread) owns a Scraper.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from otel_ebpf.core.events import Attributes, MetricRecord
from otel_ebpf.core.telemetry import Telemetry

from . import metrics as m
from .metrics import METRICS, SCOPE
from otel_ebpf.host.nvml import NOT_FOUND, Calls, GpuLost
from .processes import ProcessReader

__all__ = ["Gpu", "Scraper"]

_UINT_MAX = 0xFFFFFFFF
_F_NVLINK_COUNT, _F_NVLINK_TX, _F_NVLINK_RX, _F_PCIE_TX, _F_PCIE_RX = 91, 138, 139, 197, 198
_KIB = 1024


@dataclass
class Gpu:
    """One GPU as discovered: its handle, identity attributes and what it was found to support."""

    index: int
    handle: Any
    uuid: str
    attrs: Attributes
    throttle_supported: int = 0
    nvlink_links: int = 0
    pcie_counters: bool = False
    last_pcie: tuple[float, float, float] | None = None  # monotonic s, tx, rx (bytes)
    procs: ProcessReader | None = None
    probed: bool = False
    extra: dict[str, Attributes] = field(default_factory=dict)  # attribute-set cache


class Deltas:
    """Absolute readings -> the deltas ``updown``/``counter`` records carry, per series key."""

    def __init__(self) -> None:
        self.last: dict[tuple[Any, ...], float] = {}

    def updown(self, key: tuple[Any, ...], value: float) -> float | None:
        """value - previous (None when unchanged after the first reading)."""
        old = self.last.get(key)
        self.last[key] = value
        if old is None:
            return value
        return value - old if value != old else None

    def counter(self, key: tuple[Any, ...], total: float) -> float | None:
        """Increase of a cumulative counter; a counter that went back (driver reload) restarts."""
        old = self.last.get(key)
        self.last[key] = total
        if old is None or total < old:
            return total
        return total - old if total != old else None


class Scraper:
    """Reads every GPU. ``want_pid(pid)`` decides which processes get per-process series (None:
    no per-process calls). Not thread-safe: owned by one thread."""

    def __init__(self, nv: ModuleType, telemetry: Telemetry, *,
                 want_pid: Callable[[int], bool] | None = None) -> None:
        self.nv = nv
        self.calls = Calls(nv, telemetry)
        self.deltas = Deltas()
        self.gpus: dict[int, Gpu] = {}
        self.durations: dict[str, float] = {}
        self._want_pid = want_pid
        self._count: int | None = None
        self._driver: str | None = None

    # ---- discovery ------------------------------------------------------------------------
    def discover(self) -> None:
        """Find GPUs not yet known (all at the first call; ones that failed, later)."""
        if self._count is None:
            self._count = self.calls.call("system", "nvmlDeviceGetCount")
            self._driver = self.calls.call("system", "nvmlSystemGetDriverVersion") or ""
        for index in range(self._count or 0):
            if index not in self.gpus:
                try:
                    gpu = self._identify(index)
                except GpuLost:
                    gpu = None
                if gpu is not None:
                    self.gpus[index] = gpu

    def _identify(self, index: int) -> Gpu | None:
        call, where = self.calls.call, f"index{index}"
        handle = call(where, "nvmlDeviceGetHandleByIndex", index)
        uuid = handle is not None and call(where, "nvmlDeviceGetUUID", handle)
        if not uuid:
            return None
        model = call(uuid, "nvmlDeviceGetName", handle) or ""
        minor = call(uuid, "nvmlDeviceGetMinorNumber", handle)
        pci = call(uuid, "nvmlDeviceGetPciInfo_v3", handle)
        bus_id = pci.busId if pci is not None else None
        if isinstance(bus_id, bytes):
            bus_id = bus_id.decode(errors="replace")
        gpu = Gpu(index, handle, uuid, m.gpu_attributes(uuid, model, self._driver or "", minor, bus_id or None))
        if self._want_pid is not None:
            gpu.procs = ProcessReader(self.calls, gpu.uuid, handle, self._want_pid)
        try:
            self._probe(gpu)
        except GpuLost:
            pass  # known by its identity; probed again at the next scrape
        return gpu

    def _probe(self, gpu: Gpu) -> None:
        """What this GPU supports (throttle reasons, NVLink links, PCIe byte counters)."""
        call, uuid, handle = self.calls.call, gpu.uuid, gpu.handle
        supported = call(uuid, "nvmlDeviceGetSupportedClocksEventReasons", handle)
        if supported is None:
            supported = call(uuid, "nvmlDeviceGetSupportedClocksThrottleReasons", handle)
        gpu.throttle_supported = sum(m.THROTTLE_REASONS) if supported is None else supported
        fields = self._fields(gpu, [_F_NVLINK_COUNT, _F_PCIE_TX, _F_PCIE_RX])
        gpu.nvlink_links = int(fields.get(_F_NVLINK_COUNT, 0))
        gpu.pcie_counters = _F_PCIE_TX in fields and _F_PCIE_RX in fields
        gpu.probed = True

    def _fields(self, gpu: Gpu, ids: list[Any]) -> dict[int, float]:
        """nvmlDeviceGetFieldValues: {field id: value} for the fields that answered."""
        values = self.calls.call(gpu.uuid, "nvmlDeviceGetFieldValues", gpu.handle, ids)
        out: dict[int, float] = {}
        for v in values or ():
            if v.nvmlReturn == 0:
                out[v.fieldId] = getattr(v.value, _VALUE_MEMBER.get(v.valueType, "ullVal"))
        return out

    # ---- scrape ---------------------------------------------------------------------------
    def scrape(self) -> list[MetricRecord]:
        """Read every GPU once. Never raises for NVML trouble (counted instead)."""
        self.discover()
        out: list[MetricRecord] = []
        for gpu in self.gpus.values():
            t0 = time.perf_counter()
            lost = False
            try:
                if not gpu.probed:
                    self._probe(gpu)
                self._device(gpu, out)
            except GpuLost:
                lost = True
            self._status(gpu, lost, out)
            took = time.perf_counter() - t0
            self.durations[gpu.uuid] = took
            self.emit(out, m.SCRAPE_DURATION, took, {m.HW_ID: gpu.uuid})
        return out

    def emit(self, out: list[MetricRecord], name: str, value: float, attrs: Attributes,
             pid: int | None = None, cumulative: bool = True) -> None:
        """Append one record of ``name``; absolute updown/counter values become deltas (a
        counter with ``cumulative=False`` is already a delta)."""
        kind, unit, description = METRICS[name]
        if kind == "updown" or (kind == "counter" and cumulative):
            key = (pid, name, tuple(sorted(attrs.items())))
            delta = self.deltas.updown(key, value) if kind == "updown" else self.deltas.counter(key, value)
            if delta is None:
                return
            value = delta
        out.append(MetricRecord(pid, name, kind, value, attrs, unit=unit, description=description, scope=SCOPE))

    def _with(self, gpu: Gpu, key: str, value: str | int) -> Attributes:
        cache_key = f"{key}={value}"
        attrs = gpu.extra.get(cache_key)
        if attrs is None:
            attrs = gpu.extra[cache_key] = {**gpu.attrs, key: value}
        return attrs

    def _status(self, gpu: Gpu, lost: bool, out: list[MetricRecord]) -> None:
        self.emit(out, "hw.status", 0 if lost else 1, self._with(gpu, m.HW_STATE, "ok"))
        self.emit(out, "hw.status", 1 if lost else 0, self._with(gpu, m.HW_STATE, "failed"))

    def _device(self, gpu: Gpu, out: list[MetricRecord]) -> None:
        call, uuid, h, a = self.calls.call, gpu.uuid, gpu.handle, gpu.attrs
        util = call(uuid, "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            self.emit(out, "hw.gpu.utilization", util.gpu / 100, self._with(gpu, m.HW_TASK, "general"))
            self.emit(out, "nvidia.gpu.memory.activity", util.memory / 100, a)
        mem = call(uuid, "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            self.emit(out, "hw.gpu.memory.usage", mem.used, a)
            self.emit(out, "hw.gpu.memory.limit", mem.total, a)
            self.emit(out, "nvidia.gpu.memory.free", mem.free, a)
            if mem.total:
                self.emit(out, "hw.gpu.memory.utilization", mem.used / mem.total, a)
        self._simple(gpu, out)
        for task, function in (("encoder", "nvmlDeviceGetEncoderUtilization"),
                               ("decoder", "nvmlDeviceGetDecoderUtilization")):
            value = call(uuid, function, h)
            if value is not None:
                self.emit(out, "hw.gpu.utilization", value[0] / 100, self._with(gpu, m.HW_TASK, task))
        self._pcie(gpu, out)
        self._errors(gpu, out)
        self._throttle(gpu, out)
        if gpu.nvlink_links:
            self._nvlink(gpu, out)
        self._mig(gpu, out)
        if gpu.procs is not None:
            gpu.procs.read(self, gpu, out)

    def _simple(self, gpu: Gpu, out: list[MetricRecord]) -> None:
        """Readings that are one number each."""
        call, uuid, h, a, nv = self.calls.call, gpu.uuid, gpu.handle, gpu.attrs, self.nv
        temp = call(uuid, "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
        if temp is not None:
            self.emit(out, "hw.temperature", temp, a)
        power = call(uuid, "nvmlDeviceGetPowerUsage", h)
        if power is not None:
            self.emit(out, "hw.power", power / 1000, a)
        energy_mj = call(uuid, "nvmlDeviceGetTotalEnergyConsumption", h)
        if energy_mj is not None:
            self.emit(out, "hw.energy", energy_mj / 1000, a)
        limit = call(uuid, "nvmlDeviceGetEnforcedPowerLimit", h)
        if limit is not None:
            self.emit(out, "nvidia.gpu.power.limit", limit / 1000, a)
        fan = call(uuid, "nvmlDeviceGetFanSpeed", h)
        if fan is not None:
            self.emit(out, "hw.fan.speed_ratio", fan / 100, a)
        for domain, clock in (("sm", nv.NVML_CLOCK_SM), ("memory", nv.NVML_CLOCK_MEM)):
            mhz = call(uuid, "nvmlDeviceGetClockInfo", h, clock)
            if mhz is not None:
                self.emit(out, "nvidia.gpu.clock.speed", mhz * 1e6, self._with(gpu, m.CLOCK_DOMAIN, domain))

    def _pcie(self, gpu: Gpu, out: list[MetricRecord]) -> None:
        """Byte counters (exact) where the driver has them; else NVML's 20 ms throughput sample,
        integrated over the time since the last scrape (an estimate)."""
        now = time.monotonic()
        if gpu.pcie_counters:
            f = self._fields(gpu, [_F_PCIE_TX, _F_PCIE_RX])
            if _F_PCIE_TX not in f or _F_PCIE_RX not in f:
                return
            tx, rx = float(f[_F_PCIE_TX]), float(f[_F_PCIE_RX])
            if gpu.last_pcie is not None and now > gpu.last_pcie[0]:
                dt = now - gpu.last_pcie[0]
                rates = (max(tx - gpu.last_pcie[1], 0) / dt, max(rx - gpu.last_pcie[2], 0) / dt)
                self._pcie_rates(gpu, rates, out)
            gpu.last_pcie = (now, tx, rx)
            self._pcie_bytes(gpu, tx, rx, out, cumulative=True)
            return
        call, nv = self.calls.call, self.nv
        tx_kbs = call(gpu.uuid, "nvmlDeviceGetPcieThroughput", gpu.handle, nv.NVML_PCIE_UTIL_TX_BYTES)
        rx_kbs = call(gpu.uuid, "nvmlDeviceGetPcieThroughput", gpu.handle, nv.NVML_PCIE_UTIL_RX_BYTES)
        if tx_kbs is None or rx_kbs is None:
            return
        rates = (tx_kbs * _KIB, rx_kbs * _KIB)
        self._pcie_rates(gpu, rates, out)
        dt = now - gpu.last_pcie[0] if gpu.last_pcie is not None else 0.0
        gpu.last_pcie = (now, 0.0, 0.0)
        self._pcie_bytes(gpu, rates[0] * dt, rates[1] * dt, out, cumulative=False)

    def _pcie_rates(self, gpu: Gpu, rates: tuple[float, float], out: list[MetricRecord]) -> None:
        self.emit(out, "nvidia.gpu.pcie.throughput", rates[0], self._with(gpu, m.DIRECTION, "transmit"))
        self.emit(out, "nvidia.gpu.pcie.throughput", rates[1], self._with(gpu, m.DIRECTION, "receive"))

    def _pcie_bytes(self, gpu: Gpu, tx: float, rx: float, out: list[MetricRecord], *, cumulative: bool) -> None:
        self.emit(out, "hw.gpu.io", tx, self._with(gpu, m.DIRECTION, "transmit"), cumulative=cumulative)
        self.emit(out, "hw.gpu.io", rx, self._with(gpu, m.DIRECTION, "receive"), cumulative=cumulative)

    def _errors(self, gpu: Gpu, out: list[MetricRecord]) -> None:
        """Cumulative error counters: volatile ECC totals and PCIe replays."""
        nv = self.nv
        replays = self.calls.call(gpu.uuid, "nvmlDeviceGetPcieReplayCounter", gpu.handle)
        if replays is not None:
            self.emit(out, "hw.errors", replays, self._with(gpu, m.ERROR_TYPE, "pcie_replay"))
        for error, kind in (("ecc_corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                            ("ecc_uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            total = self.calls.call(gpu.uuid, "nvmlDeviceGetTotalEccErrors", gpu.handle, kind, nv.NVML_VOLATILE_ECC)
            if total is not None:
                self.emit(out, "hw.errors", total, self._with(gpu, m.ERROR_TYPE, error))

    def _throttle(self, gpu: Gpu, out: list[MetricRecord]) -> None:
        # nvmlDeviceGetCurrentClocksEventReasons is the r535+ name of ...ThrottleReasons.
        mask = self.calls.first(gpu.uuid, ("nvmlDeviceGetCurrentClocksEventReasons",
                                           "nvmlDeviceGetCurrentClocksThrottleReasons"), gpu.handle)
        if mask is None:
            return
        for bit, reason in m.THROTTLE_REASONS.items():
            if gpu.throttle_supported & bit:
                self.emit(out, "nvidia.gpu.clock.throttled", 1 if mask & bit else 0,
                          self._with(gpu, m.THROTTLE_REASON, reason))

    def _nvlink(self, gpu: Gpu, out: list[MetricRecord]) -> None:
        for link in range(gpu.nvlink_links):
            state = self.calls.call(gpu.uuid, "nvmlDeviceGetNvLinkState", gpu.handle, link)
            if state is not None:
                self.emit(out, "nvidia.gpu.nvlink.up", 1 if state else 0, self._with(gpu, m.NVLINK_LINK, link))
        # Scope UINT_MAX: the GPU's total over all links (KiB counters since the driver loaded).
        f = self._fields(gpu, [(_F_NVLINK_TX, _UINT_MAX), (_F_NVLINK_RX, _UINT_MAX)])
        for fid, direction in ((_F_NVLINK_TX, "transmit"), (_F_NVLINK_RX, "receive")):
            if fid in f:
                self.emit(out, "nvidia.gpu.nvlink.io", float(f[fid]) * _KIB, self._with(gpu, m.DIRECTION, direction))

    def _mig(self, gpu: Gpu, out: list[MetricRecord]) -> None:
        call = self.calls.call
        mode = call(gpu.uuid, "nvmlDeviceGetMigMode", gpu.handle)
        if mode is None:
            return
        self.emit(out, "nvidia.gpu.mig.enabled", 1 if mode[0] else 0, gpu.attrs)
        if not mode[0]:
            return
        slots = call(gpu.uuid, "nvmlDeviceGetMaxMigDeviceCount", gpu.handle) or 0
        found = 0
        for i in range(slots):
            mig = call(gpu.uuid, "nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, i, quiet=(NOT_FOUND,))
            mig_uuid = mig is not None and call(gpu.uuid, "nvmlDeviceGetUUID", mig)
            if not mig_uuid:
                continue
            found += 1
            attrs = {**gpu.attrs, m.HW_ID: mig_uuid, m.HW_PARENT: gpu.uuid}
            for key, function in ((m.MIG_GPU_INSTANCE, "nvmlDeviceGetGpuInstanceId"),
                                  (m.MIG_COMPUTE_INSTANCE, "nvmlDeviceGetComputeInstanceId")):
                value = call(gpu.uuid, function, mig)
                if value is not None:
                    attrs[key] = value
            mem = call(gpu.uuid, "nvmlDeviceGetMemoryInfo", mig)
            if mem is not None:
                self.emit(out, "hw.gpu.memory.usage", mem.used, attrs)
                self.emit(out, "hw.gpu.memory.limit", mem.total, attrs)
        self.emit(out, "nvidia.gpu.mig.instances", found, gpu.attrs)


_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
