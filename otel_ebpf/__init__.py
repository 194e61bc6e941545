"""otel-ebpf: eBPF + NVML to OpenTelemetry for AI/ML jobs.

The Python API: :class:`Session` and :func:`read_otlp_json` (loaded on first use: the CLI does not
need them) and the errors a session raises, from :mod:`otel_ebpf.core.errors` (its docstring draws
the whole hierarchy): ``OtelEbpfError`` (the base), ``ConfigError`` (names the key path) and
``TargetError`` (the process to trace is wrong or gone).
"""
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type checkers see the real names; at run time they load on first use
    from otel_ebpf.api import Session, read_otlp_json

from otel_ebpf.core.errors import ConfigError, OtelEbpfError, TargetError
from otel_ebpf.core.version import __version__

__all__ = ["ConfigError", "OtelEbpfError", "Session", "TargetError", "__version__", "read_otlp_json"]


def __getattr__(name: str) -> Any:  # the Python API, imported on first use (the CLI does not need it)
    if name in ("Session", "read_otlp_json"):
        from otel_ebpf import api
        return getattr(api, name)
    raise AttributeError(f"module 'otel_ebpf' has no attribute {name!r}")
