"""Names, units and attributes of everything the NVML receiver emits (scope ``otel_ebpf.nvml``).

OpenTelemetry semantic-convention names (``hw.*``, from opentelemetry-semantic-conventions'
incubating ``hw_metrics`` / ``hw_attributes``) where one exists, with its instrument and unit;
otel-ebpf's own ``nvidia.gpu.*`` names for what semconv does not cover. docs/nvml.md maps each
one to dcgm-exporter's ``DCGM_FI_*`` field.

Attributes on every GPU series (:func:`gpu_attributes`): ``hw.id`` (the UUID exactly as
``nvmlDeviceGetUUID`` and dcgm-exporter's ``UUID`` label write it, ``GPU-...``), ``hw.type``
(``gpu``), ``hw.name`` (``nvidia<minor>``, dcgm-exporter's ``device`` label), ``hw.model``
(``nvmlDeviceGetName``), ``hw.vendor`` (``NVIDIA``), ``hw.driver_version``, ``gpu.index`` (the
minor number, as in /dev/nvidia<N>) and ``pci.bus_id`` (``00000000:3B:00.0``). A MIG instance
has its own ``hw.id`` (``MIG-...``) and ``hw.parent`` = its GPU's UUID.
"""
from __future__ import annotations

from opentelemetry.semconv._incubating.attributes import hw_attributes as hwa
from opentelemetry.semconv._incubating.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv._incubating.attributes.network_attributes import NETWORK_IO_DIRECTION
from opentelemetry.semconv._incubating.metrics import hw_metrics as hw

from otel_ebpf.core.events import Attributes, MetricKind
from otel_ebpf.host.nvml import SCRAPE_ERRORS

__all__ = [
    "CLOCK_DOMAIN", "DIRECTION", "ERROR_TYPE", "GPU_INDEX", "HW_ID", "HW_PARENT", "HW_STATE", "HW_TASK",
    "METRICS", "MIG_COMPUTE_INSTANCE", "MIG_GPU_INSTANCE", "NVLINK_LINK", "PCI_BUS_ID", "SCOPE",
    "SCRAPE_DURATION", "SCRAPE_ERRORS", "THROTTLE_REASON", "THROTTLE_REASONS", "gpu_attributes",
]

SCOPE = "otel_ebpf.nvml"

# Attribute keys: semconv where it has them, otel-ebpf's own (nvidia.gpu.*, gpu.index, pci.bus_id) otherwise.
HW_ID = hwa.HW_ID
HW_PARENT = hwa.HW_PARENT
HW_TASK = hwa.HW_GPU_TASK
HW_STATE = hwa.HW_STATE
DIRECTION = NETWORK_IO_DIRECTION
GPU_INDEX = "gpu.index"
PCI_BUS_ID = "pci.bus_id"
CLOCK_DOMAIN = "nvidia.gpu.clock.domain"
THROTTLE_REASON = "nvidia.gpu.clock.throttle_reason"
NVLINK_LINK = "nvidia.gpu.nvlink.link"
MIG_GPU_INSTANCE = "nvidia.gpu.mig.gpu_instance_id"
MIG_COMPUTE_INSTANCE = "nvidia.gpu.mig.compute_instance_id"

SCRAPE_DURATION = "otel_ebpf.nvml.scrape.duration"

# name -> (instrument kind, UCUM unit, description). "updown" and "counter" records are deltas.
METRICS: dict[str, tuple[MetricKind, str, str]] = {
    hw.HW_GPU_UTILIZATION: ("gauge", "1", "Fraction of time the GPU (or this process on it) spent in a task "
                                          "(hw.gpu.task: general = SM, encoder, decoder), 0..1."),
    hw.HW_GPU_MEMORY_USAGE: ("updown", "By", "GPU memory used (by this process, on a process resource)."),
    hw.HW_GPU_MEMORY_LIMIT: ("updown", "By", "Size of the GPU memory."),
    hw.HW_GPU_MEMORY_UTILIZATION: ("gauge", "1", "Fraction of GPU memory used (used / total)."),
    hw.HW_GPU_IO: ("counter", "By", "Bytes received and transmitted by the GPU over PCIe."),
    hw.HW_ERRORS: ("counter", "{error}", "GPU errors: ECC (error.type=ecc_corrected|ecc_uncorrected, "
                                         "volatile counts), PCIe replays (pcie_replay) and XID events "
                                         "(error.type=xid_<n>)."),
    hw.HW_STATUS: ("updown", "1", "1 for the GPU's current state (hw.state=ok|failed), 0 for the other."),
    hw.HW_TEMPERATURE: ("gauge", "Cel", "GPU core temperature."),
    hw.HW_POWER: ("gauge", "W", "Power drawn by the GPU (board)."),
    hw.HW_ENERGY: ("counter", "J", "Energy consumed by the GPU since the driver loaded."),
    hw.HW_FAN_SPEED_RATIO: ("gauge", "1", "Fan speed as a fraction of its maximum, 0..1."),
    "nvidia.gpu.memory.free": ("updown", "By", "GPU memory free."),
    "nvidia.gpu.memory.activity": ("gauge", "1", "Fraction of time device memory was being read or written "
                                                 "(NVML utilization.memory), 0..1."),
    "nvidia.gpu.power.limit": ("gauge", "W", "Power limit the driver enforces."),
    "nvidia.gpu.clock.speed": ("gauge", "Hz", "Current clock (nvidia.gpu.clock.domain=sm|memory)."),
    "nvidia.gpu.pcie.throughput": ("gauge", "By/s", "PCIe throughput over NVML's last 20 ms sample."),
    "nvidia.gpu.clock.throttled": ("gauge", "1", "1 while the clocks are held down for this reason "
                                                 "(nvidia.gpu.clock.throttle_reason), else 0."),
    "nvidia.gpu.nvlink.up": ("gauge", "1", "1 when this NVLink (nvidia.gpu.nvlink.link) is active, else 0."),
    "nvidia.gpu.nvlink.io": ("counter", "By", "NVLink data bytes received and transmitted, all links."),
    "nvidia.gpu.mig.enabled": ("gauge", "1", "1 when MIG mode is on, else 0."),
    "nvidia.gpu.mig.instances": ("gauge", "{instance}", "MIG devices (GPU + compute instances) on this GPU."),
    SCRAPE_DURATION: ("histogram", "s", "Time to read one GPU through NVML (one scrape)."),
}

#: NVML clocks event (throttle) reason bits -> attribute value (nvml.h nvmlClocksEventReason*).
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def gpu_attributes(uuid: str, model: str, driver: str, minor: int | None, bus_id: str | None) -> Attributes:
    """The attributes every series of one GPU carries (see the module docstring)."""
    attrs: dict[str, str | int] = {HW_ID: uuid, hwa.HW_TYPE: "gpu", hwa.HW_VENDOR: "NVIDIA",
                                   hwa.HW_MODEL: model, hwa.HW_DRIVER_VERSION: driver}
    if minor is not None:
        attrs[hwa.HW_NAME] = f"nvidia{minor}"
        attrs[GPU_INDEX] = minor
    if bus_id:
        attrs[PCI_BUS_ID] = bus_id
    return attrs
