"""Is there an NVIDIA GPU on this host at all? The PCI bus says so, whatever the driver's state.

NVML failing to load means two different things: on a host without an NVIDIA GPU it is expected
(the default pipeline has ``nvml`` on every host), so the receiver says so at INFO and ``otel-ebpf
check`` shows one row "no NVIDIA driver/GPU: NVML metrics off"; on a host that has one it is a
fault to fix (no driver, driver not loaded, a container without the driver's libraries), so it
stays a warning. The GPUs are read from sysfs (``/sys/bus/pci/devices/*/vendor`` and ``class``),
which lists them with no driver loaded and in containers (sysfs is mounted read-only there).
Blocking file reads; never raises.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["NO_GPU", "PCI_DEVICES", "nvidia_gpus"]

PCI_DEVICES = Path("/sys/bus/pci/devices")
NVIDIA_VENDOR = "0x10de"  # PCI-SIG vendor id of NVIDIA
_DISPLAY_CLASS = "0x03"  # PCI base class 03h: display controller (VGA 0300, 3D controller 0302: datacenter GPUs)
NO_GPU = "no NVIDIA driver/GPU: NVML metrics off"


def _read(path: Path) -> str:
    try:
        return path.read_text().strip().lower()
    except OSError:
        return ""


def nvidia_gpus(root: Path | None = None) -> list[str]:
    """PCI addresses (``0000:3b:00.0``) of the NVIDIA display controllers under ``root``
    (default :data:`PCI_DEVICES`), sorted; [] when there are none or sysfs cannot be read."""
    base = PCI_DEVICES if root is None else root
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return []
    return [d.name for d in devices
            if _read(d / "vendor") == NVIDIA_VENDOR and _read(d / "class").startswith(_DISPLAY_CLASS)]
