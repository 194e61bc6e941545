"""The twin's environment: the venv holding the pinned torch CUDA wheel and the real CUDA/NCCL headers.

scripts/setup.sh makes it (``.venv-twin`` at the checkout's root): ``torch==2.11.0`` installed ``--no-deps``,
and the headers of the CUDA runtime and of the NCCL that torch pins extracted under ``twin-include/``. The
real libraries must NOT be in that venv: torch's libraries name ``$ORIGIN/../../nvidia/*/lib`` in DT_RPATH,
which the dynamic loader searches before LD_LIBRARY_PATH, so a real libcudart/libnccl there would be loaded
instead of the stand-ins. ``find_env`` refuses such a venv.

``OTEL_EBPF_TWIN_VENV`` names another venv. Nothing here imports torch (that needs the stand-ins).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from otel_ebpf.twin.errors import SETUP_HINT, TwinSetupError

__all__ = ["TORCH_VERSION", "TwinEnv", "default_venv", "find_env"]

TORCH_VERSION = "2.11.0"  # the CUDA wheel the GPU machines we validate on run (issue 14)
ENV_VENV = "OTEL_EBPF_TWIN_VENV"


@dataclass(frozen=True)
class TwinEnv:
    """Paths of a checked twin environment (immutable; safe to share between threads)."""

    venv: Path
    python: Path
    torch_dir: Path       # site-packages/torch
    cuda_include: Path    # holds cuda_runtime_api.h (CUDA 13)
    nccl_include: Path    # holds nccl.h (the NCCL torch pins)


def default_venv() -> Path:
    """$OTEL_EBPF_TWIN_VENV, else ``.venv-twin`` in the checkout this package runs from."""
    named = os.environ.get(ENV_VENV)
    return Path(named) if named else Path(__file__).resolve().parents[2] / ".venv-twin"


def _torch_version(site: Path) -> str | None:
    found = sorted(site.glob("torch-*.dist-info/METADATA"))
    if not found:
        return None
    m = re.search(r"^Version: (\S+)$", found[0].read_text(errors="replace"), re.M)
    return m.group(1) if m else None


def find_env(venv: Path | None = None) -> TwinEnv:
    """Checks the twin's venv and returns its paths; ``TwinSetupError`` names what is missing or wrong."""
    venv = (venv or default_venv()).absolute()
    python = venv / "bin" / "python"
    if not python.exists():
        raise TwinSetupError(f"no twin environment at {venv} (torch=={TORCH_VERSION}, CUDA wheel)", hint=SETUP_HINT)
    sites = sorted(venv.glob("lib/python3*/site-packages"))
    site = sites[0] if sites else venv / "lib"
    version = _torch_version(site)
    if version != TORCH_VERSION:
        raise TwinSetupError(f"the twin needs torch=={TORCH_VERSION} (the CUDA wheel) in {venv}; found "
                             f"{version or 'no torch'}", hint=SETUP_HINT)
    torch_dir = site / "torch"
    if not (torch_dir / "lib" / "libtorch_cuda.so").exists():
        raise TwinSetupError(f"{torch_dir} is a CPU-only torch build; the twin needs the CUDA wheel "
                             f"(pip install --no-deps torch=={TORCH_VERSION} from PyPI)", hint=SETUP_HINT)
    real = [p for p in (site / "nvidia").glob("*/lib/lib*.so*") if p.name.split(".so")[0] in ("libcudart", "libnccl")]
    if real:
        raise TwinSetupError(f"real CUDA libraries in the twin's venv would be loaded instead of the stand-ins "
                             f"(torch's DT_RPATH names them before LD_LIBRARY_PATH): {', '.join(map(str, real))}",
                             hint="pip uninstall them from that venv; torch is installed there with --no-deps")
    include = venv / "twin-include"
    for header in (include / "cuda" / "cuda_runtime_api.h", include / "nccl" / "nccl.h"):
        if not header.exists():
            raise TwinSetupError(f"missing header {header} (the stand-ins compile against the real prototypes)",
                                 hint=SETUP_HINT)
    return TwinEnv(venv, python, torch_dir, include / "cuda", include / "nccl")
