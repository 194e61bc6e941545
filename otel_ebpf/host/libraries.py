"""Finding the libraries to probe, per process, never from hard-coded paths.

Sources, in order: paths from config; libraries already mapped by the target processes
(``/proc/PID/maps``); the traced command's Python environment (PyTorch wheels ship
``site-packages/nvidia/cuda_runtime/lib/libcudart.so.12`` for CUDA 12 and
``site-packages/nvidia/cu13/lib/libcudart.so.13`` for CUDA 13 (nvidia-cuda-runtime 13.x), NCCL in
``nvidia/nccl/lib``, and load them lazily; a conda environment has them in ``$CONDA_PREFIX/lib``); and the
dynamic linker cache (``ldconfig -p``). Libraries opened later are caught in the kernel
(``OE_LIB_PATTERN``) and attached then.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence

__all__ = ["LIBRARY_PATTERNS", "file_mappings", "find_libraries", "interpreter_of_command", "mapped_libraries",
           "python_env_libraries"]

# key -> basename prefix (also passed to the kernel as OE_LIB_PATTERN)
LIBRARY_PATTERNS = {"cudart": "libcudart.so", "nccl": "libnccl.so", "cuda_driver": "libcuda.so"}
# the driver comes with the NVIDIA driver (ldconfig, or mounted into a container), never in a wheel
_WHEEL_DIRS = {"cudart": ("nvidia/cuda_runtime/lib", "nvidia/cu13/lib"), "nccl": ("nvidia/nccl/lib",),
               "cuda_driver": ()}


def _real(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        try:
            rp = os.path.realpath(p)
        except OSError:
            continue
        if os.path.isfile(rp) and rp not in out:
            out.append(rp)
    return out


def file_mappings(pid: int, proc_root: str = "/proc") -> list[tuple[int, int, int, str]] | None:
    """The file-backed mappings of ``pid`` from ``/proc/PID/maps``: (start, end, file offset, path as the
    process sees it); None when it cannot be read (the process is gone)."""
    try:
        with open(f"{proc_root}/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
    except OSError:
        return None
    out = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            lo, _, hi = parts[0].partition("-")
            try:
                out.append((int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5].strip()))
            except ValueError:
                continue
    return out


def mapped_libraries(pid: int, prefix: str, proc_root: str = "/proc") -> list[str]:
    """Files mapped by ``pid`` whose basename starts with ``prefix`` (as the process sees
    them, resolved through /proc/PID/root so container paths work)."""
    found = []
    for _, _, _, path in file_mappings(pid, proc_root) or ():
        if os.path.basename(path).startswith(prefix):
            root_path = f"{proc_root}/{pid}/root{path}"
            found.append(root_path if os.path.exists(root_path) else path)
    return _real(found)


_PREFIX_LINE = "prefix:"


def _python_dirs(python: str) -> tuple[list[str], str | None]:
    """(site-packages and sys.path directories, sys.prefix) of the interpreter ``python``."""
    exe = shutil.which(python) or python
    try:
        out = subprocess.run([exe, "-c", "import site,sys;print('\\n'.join(site.getsitepackages()+"
                              f"[site.getusersitepackages()]+sys.path+['{_PREFIX_LINE}'+sys.prefix]))"],
                             capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return [], None
    lines = out.splitlines()
    prefix = next((line[len(_PREFIX_LINE):] for line in lines if line.startswith(_PREFIX_LINE)), None)
    return [d for d in lines if d and not d.startswith(_PREFIX_LINE) and os.path.isdir(d)], prefix


def _python_site_dirs(python: str) -> list[str]:
    return _python_dirs(python)[0]


def python_env_libraries(command: Sequence[str], key: str) -> list[str]:
    """Libraries for ``key`` in the Python environment the command would run in.

    ``command[0]`` being a Python interpreter (or a script whose shebang names one, or a
    console script of a venv like ``torchrun``) points at its site-packages.
    """
    if not command:
        return []
    exe = shutil.which(command[0]) or command[0]
    python = None
    if "python" in os.path.basename(exe):
        python = exe
    else:
        try:
            with open(exe, "rb") as fh:
                first = fh.readline(256).decode(errors="replace")
            if first.startswith("#!") and "python" in first:
                python = first[2:].split()[0]
        except OSError:
            pass
    if python is None:
        return []
    prefix = LIBRARY_PATTERNS[key]
    paths: list[str] = []
    site_dirs, env_prefix = _python_dirs(python)
    for d in site_dirs:
        for wheel_dir in _WHEEL_DIRS[key]:
            paths += glob.glob(os.path.join(d, wheel_dir, prefix + "*"))
        paths += glob.glob(os.path.join(d, "torch", "lib", prefix + "*"))
    if env_prefix and key in _WHEEL_DIRS and _WHEEL_DIRS[key]:
        # conda: the cuda-cudart and nccl packages (conda-forge, nvidia channel) install into $CONDA_PREFIX/lib
        paths += glob.glob(os.path.join(env_prefix, "lib", prefix + "*"))
    return _real(sorted(paths))


def _ldconfig(prefix: str) -> list[str]:
    exe = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.rsplit("=>", 1)[1].strip() for line in out.splitlines()
            if "=>" in line and line.strip().startswith(prefix)]


def find_libraries(key: str, *, configured: Sequence[str] = (), pids: Sequence[int] = (),
                   command: Sequence[str] = (), use_ldconfig: bool = True) -> list[str]:
    """Every distinct (real path) library for ``key`` ('cudart', 'nccl', 'cuda_driver') from all sources."""
    prefix = LIBRARY_PATTERNS[key]
    paths = list(configured)
    for pid in pids:
        paths += mapped_libraries(pid, prefix)
    paths += python_env_libraries(command, key)
    if use_ldconfig:
        paths += _ldconfig(prefix)
    return _real(paths)


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def interpreter_of_command(command: list[str]) -> str | None:
    """The ELF interpreter ``command`` would run: ``command[0]`` itself, or the program its
    '#!' line names (``/usr/bin/env python3`` resolved on PATH). None when not found."""
    if not command:
        return None
    exe = shutil.which(command[0]) or command[0]
    for _ in range(3):  # a '#!' chain, bounded
        if _is_elf(exe):
            return os.path.realpath(exe)
        try:
            with open(exe, "rb") as fh:
                first = fh.readline(256).decode(errors="replace")
        except OSError:
            return None
        if not first.startswith("#!"):
            return None
        words = first[2:].split()
        if not words:
            return None
        if os.path.basename(words[0]) == "env" and len(words) > 1:
            words = words[1:]
        exe = shutil.which(words[0]) or words[0]
    return None
