"""otel-ebpf: eBPF + NVML to OpenTelemetry for AI/ML jobs."""
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type checkers see the real names; at run time they load on first use
    from otel_ebpf.api import Session, read_otlp_json

from otel_ebpf.core.version import __version__
__all__ = ["Session", "__version__", "read_otlp_json"]


def __getattr__(name: str) -> Any:  # the Python API, imported on first use (the CLI does not need it)
    if name in ("Session", "read_otlp_json"):
        from otel_ebpf import api
        return getattr(api, name)
    raise AttributeError(f"module 'otel_ebpf' has no attribute {name!r}")
