"""The demo's native pieces: the stand-in libnccl.so.2 (compiled here) and NVIDIA's CUDA runtime
(found in the nvidia-cuda-runtime-cu12 wheel, never at a hard-coded path).

:func:`build_stand_in_nccl` is also what ``tests/support/build.py`` uses, so the tests and the
demo probe the same library built with the same flags. It recompiles only when the source (or
this file, which holds the flags) is newer than the output, writes to a temporary name and
renames it into place (concurrent builders never load a half-written library), and raises
:class:`~otel_ebpf.core.errors.EnvironmentError_` naming the command when gcc is missing or fails.
"""
from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from otel_ebpf.core.errors import EnvironmentError_

__all__ = ["COMMON_FLAGS", "COMPILER", "STAND_IN_FLAGS", "STAND_IN_SOURCE", "build_stand_in_nccl", "compile_c",
           "find_cudart", "find_wheel_library"]

STAND_IN_SOURCE = Path(__file__).resolve().parent / "stand_in_nccl.c"
COMPILER = "gcc"
# -fno-omit-frame-pointer: every function then starts with `push %rbp`, which the kernel
# emulates for a uprobe instead of single-stepping it.
COMMON_FLAGS = ("-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra")
# -fno-shrink-wrap keeps `push %rbp` first even in functions that return early (gcc 12 -O1
# otherwise moves the prologue after the argument checks; see the source's header).
STAND_IN_FLAGS = ("-fno-shrink-wrap", "-fPIC", "-shared", "-Wl,-soname,libnccl.so.2")
_LIBS = ("-lpthread",)


def build_stand_in_nccl(out_dir: str | os.PathLike[str]) -> Path:
    """Compile the stand-in to ``out_dir/libnccl.so.2`` (if out of date) and return its path.

    Blocks while compiling (well under a second); safe to call from several processes at once.
    """
    return compile_c(STAND_IN_SOURCE, Path(out_dir) / "libnccl.so.2", STAND_IN_FLAGS, _LIBS)


def compile_c(source: Path, output: Path, flags: tuple[str, ...], libs: tuple[str, ...],
              extra_inputs: tuple[Path, ...] = ()) -> Path:
    """``gcc COMMON_FLAGS flags -o output source libs`` unless ``output`` is newer than the
    source, this file (which holds the flags) and ``extra_inputs``. Written to a temporary name
    and renamed, so concurrent builders never load a half-written file. Raises
    EnvironmentError_ naming the command when the compiler is missing or fails."""
    if _up_to_date(output, (source, Path(__file__).resolve(), *extra_inputs)):
        return output
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    cmd = [COMPILER, *COMMON_FLAGS, *flags, "-o", str(tmp), str(source), *libs]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        tmp.unlink(missing_ok=True)
        raise EnvironmentError_(f"cannot run the C compiler: {shlex.join(cmd)}: {exc}",
                                hint="install gcc (e.g. apt-get install gcc)") from None
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise EnvironmentError_(f"compile failed (exit {proc.returncode}): {shlex.join(cmd)}\n{proc.stderr}")
    tmp.chmod(0o755)
    os.replace(tmp, output)
    return output


def _up_to_date(output: Path, inputs: tuple[Path, ...]) -> bool:
    try:
        built = output.stat().st_mtime_ns
    except FileNotFoundError:
        return False
    return all(p.stat().st_mtime_ns <= built for p in inputs)


def find_wheel_library(package: str, names: tuple[str, ...]) -> Path | None:
    """``site-packages/<package as dirs>/lib/<name>`` from NVIDIA's wheels for this interpreter, or
    None. ``nvidia`` is a namespace package: every directory providing it is searched."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.submodule_search_locations is None:
        return None
    for location in spec.submodule_search_locations:
        for name in names:
            candidate = Path(location) / "lib" / name
            if candidate.is_file():
                return candidate
    return None


def find_cudart() -> Path | None:
    """NVIDIA's libcudart from the nvidia-cuda-runtime-cu12 (or -cu13) wheel, or None."""
    return find_wheel_library("nvidia.cuda_runtime", ("libcudart.so.12", "libcudart.so.13"))
