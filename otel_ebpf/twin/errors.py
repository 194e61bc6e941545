"""The twin's errors, in the one hierarchy of otel_ebpf.core.errors (both are ``EnvironmentError_``: the host
lacks something the twin needs)::

    EnvironmentError_
    ├── TwinSetupError   the twin's environment is missing or wrong (its venv, torch version, headers)
    └── TwinBuildError   compiling the stand-ins failed (names the compiler, header or tool)
"""
from __future__ import annotations

from otel_ebpf.core.errors import EnvironmentError_

__all__ = ["TwinBuildError", "TwinSetupError"]

SETUP_HINT = "run scripts/setup.sh (it installs the twin's .venv-twin); docs/twin.md"


class TwinSetupError(EnvironmentError_):
    """The twin's venv, its torch, or the CUDA/NCCL headers are missing or not the pinned versions."""


class TwinBuildError(EnvironmentError_):
    """A stand-in or stub library did not compile or link; the message names the tool and the file."""
