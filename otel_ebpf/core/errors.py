"""The one exception hierarchy of otel-ebpf.

::

    OtelEbpfError                 base; every error the agent raises on purpose
    ├── ConfigError               a config file, key or value is wrong (names the key path)
    ├── EnvironmentError_         the host cannot run a part of the agent
    │   ├── PrivilegeError        not root / missing CAP_BPF, CAP_PERFMON
    │   ├── BccMissingError       the BCC Python module is not importable
    │   ├── KernelHeadersError    BCC cannot compile: no headers for this kernel
    │   ├── TwinSetupError        (otel_ebpf.twin) the twin's torch environment is missing or wrong
    │   └── TwinBuildError        (otel_ebpf.twin) the twin's stand-in libraries cannot be built
    ├── BpfLoadError              a BPF program failed to compile or verify
    ├── AttachError               a probe could not attach (names the library and symbol)
    └── TargetError               the process to trace is wrong or gone (names the PID/command)

Hot paths never raise these: they count the fault and go on. These are for start-up and
configuration, where the user must see what is wrong and how to fix it.
"""
from __future__ import annotations

__all__ = [
    "AttachError",
    "BccMissingError",
    "BpfLoadError",
    "ConfigError",
    "EnvironmentError_",
    "KernelHeadersError",
    "OtelEbpfError",
    "PrivilegeError",
    "TargetError",
]


class OtelEbpfError(Exception):
    """Base of every deliberate otel-ebpf error. ``hint`` says how to fix it, when we know."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base}\n  hint: {self.hint}" if self.hint else base


class ConfigError(OtelEbpfError):
    """Invalid configuration. ``path`` is the dotted key path, e.g. ``receivers.cuda.symbols``."""

    def __init__(self, path: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"config error at '{path}': {message}" if path else f"config error: {message}",
                         hint=hint)
        self.path = path


class EnvironmentError_(OtelEbpfError):
    """The host lacks something a component needs."""


class PrivilegeError(EnvironmentError_):
    """Not enough privilege to load BPF programs."""


class BccMissingError(EnvironmentError_):
    """The BCC Python bindings are not importable from this interpreter."""


class KernelHeadersError(EnvironmentError_):
    """No kernel headers for the running kernel, so BCC cannot compile."""


class BpfLoadError(OtelEbpfError):
    """A BPF program did not compile or was rejected by the verifier."""


class AttachError(OtelEbpfError):
    """A probe could not be attached. ``library`` and ``symbol`` name where."""

    def __init__(self, library: str, symbol: str, reason: str) -> None:
        super().__init__(f"cannot attach to {symbol} in {library}: {reason}")
        self.library = library
        self.symbol = symbol


class TargetError(OtelEbpfError):
    """The traced process or command is invalid or has gone."""
