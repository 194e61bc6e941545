"""Build the C test programs and find the CUDA/NCCL libraries from PyPI wheels.

Programs (sources next to this file, outputs under ``tests/support/build/``,
which is gitignored):

- ``cuda_driver``: calls a libcudart.so.12 with known arguments.
- ``nccl_rank``: one rank of a scripted NCCL job.
- ``stand_in_nccl``: ``build/stand_in_nccl/libnccl.so.2``, a stand-in for
  NVIDIA's libnccl.so.2 on machines without a GPU. Its source and flags live in
  the product (``otel_ebpf/demo/``: ``otel-ebpf demo`` needs it too); this
  module builds it with :func:`otel_ebpf.demo.build.build_stand_in_nccl`.

:func:`build_all` recompiles a program only when its source (or this file or
otel_ebpf/demo/build.py, which hold the flags) is newer than the output.  Outputs are written to a
temporary name and renamed into place, so concurrent test workers never run a
half-written binary.  Compile errors raise :class:`RuntimeError` naming the
command and the compiler's stderr.

Run ``python tests/support/build.py`` to build everything and print the paths.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

# COMPILER and COMMON_FLAGS (-fno-omit-frame-pointer: see there) are shared with the stand-in.
from otel_ebpf.demo import build as _demo_build
from otel_ebpf.demo.build import build_stand_in_nccl
from otel_ebpf.core.errors import OtelEbpfError

__all__ = ["BUILD_DIR", "SUPPORT_DIR", "build_all", "build_stand_in_nvml", "real_cudart", "real_nccl"]

SUPPORT_DIR = Path(__file__).resolve().parent
BUILD_DIR = SUPPORT_DIR / "build"


@dataclass(frozen=True)
class _Target:
    name: str
    source: str
    output: str  # relative to the build directory
    flags: tuple[str, ...]
    libs: tuple[str, ...]


_TARGETS = (
    # -rdynamic exports cuda_driver's pthread_once, which the in-call sleep needs.
    _Target("cuda_driver", "cuda_driver.c", "cuda_driver", ("-rdynamic",), ("-ldl", "-lpthread")),
    _Target("nccl_rank", "nccl_rank.c", "nccl_rank", (), ("-ldl",)),
)


def build_all(out_dir: Path | None = None) -> dict[str, Path]:
    """Build every test program; return {name: path of the built file}.

    Names: ``cuda_driver``, ``nccl_rank``, ``stand_in_nccl``.  ``out_dir``
    defaults to ``tests/support/build``.  Blocks while compiling; safe to
    call from several processes at once.  Raises RuntimeError when the
    compiler is missing or fails.
    """
    out = Path(out_dir) if out_dir is not None else BUILD_DIR
    built = {t.name: _build(t, out) for t in _TARGETS}
    try:
        built["stand_in_nccl"] = build_stand_in_nccl(out / "stand_in_nccl")
    except OtelEbpfError as exc:
        raise RuntimeError(str(exc)) from None
    return built


def _build(target: _Target, out_dir: Path) -> Path:
    try:
        return _demo_build.compile_c(SUPPORT_DIR / target.source, out_dir / target.output, tuple(target.flags),
                                     tuple(target.libs), extra_inputs=(Path(__file__).resolve(),))
    except OtelEbpfError as exc:
        raise RuntimeError(str(exc)) from None


def build_stand_in_nvml(out_dir: Path | None = None) -> Path:
    """Compile ``stand_in_nvml.c`` (a stand-in, not NVIDIA's library) to
    ``<out_dir>/stand_in_nvml/libnvidia-ml.so.1`` (soname libnvidia-ml.so.1) and return its path.

    Put its directory on LD_LIBRARY_PATH (or give it as ``receivers.nvml.library``) and pynvml
    loads it as NVML. ``out_dir`` defaults to ``tests/support/build``. Rebuilds only when out of
    date; safe from several processes at once; RuntimeError names the command when gcc fails.
    """
    target = _Target("stand_in_nvml", "stand_in_nvml.c", "stand_in_nvml/libnvidia-ml.so.1",
                     ("-fPIC", "-shared", "-Wl,-soname,libnvidia-ml.so.1"), ("-lpthread",))
    return _build(target, Path(out_dir) if out_dir is not None else BUILD_DIR)


def real_cudart() -> Path | None:
    """NVIDIA's libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel, if installed."""
    return _demo_build.find_wheel_library("nvidia.cuda_runtime", ("libcudart.so.12",))


def real_nccl() -> Path | None:
    """NVIDIA's libnccl.so.2 from the nvidia-nccl-cu12 wheel, if installed."""
    return _demo_build.find_wheel_library("nvidia.nccl", ("libnccl.so.2",))


def main() -> int:
    try:
        built = build_all()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    for name, path in built.items():
        print(f"{name}: {path}")
    print(f"real_cudart: {real_cudart()}")
    print(f"real_nccl: {real_nccl()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
