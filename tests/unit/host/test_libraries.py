"""Where the libraries to probe are found in a Python environment (otel_ebpf.host.libraries): the layouts of
the NVIDIA wheels PyTorch depends on, CUDA 12 and 13."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from otel_ebpf.host.libraries import find_libraries, python_env_libraries


def _venv(tmp_path: Path, files: list[str]) -> Path:
    """A fake environment: a `python` that prints `site` as its only site-packages, and ELF-less files."""
    site = tmp_path / "site"
    for rel in files:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(b"\x7fELF")
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'print(\"{site}\")'\n")
    python.chmod(0o755)
    return python


def test_cuda_12_and_13_wheel_layouts_are_both_found(tmp_path: Path) -> None:
    python = _venv(tmp_path, ["nvidia/cuda_runtime/lib/libcudart.so.12",  # nvidia-cuda-runtime-cu12
                              "nvidia/cu13/lib/libcudart.so.13",  # nvidia-cuda-runtime 13.x
                              "nvidia/nccl/lib/libnccl.so.2",
                              "nvidia/cu13/lib/libcublas.so.13"])
    site = tmp_path / "site"
    assert python_env_libraries([str(python), "train.py"], "cudart") == [
        str(site / "nvidia/cu13/lib/libcudart.so.13"), str(site / "nvidia/cuda_runtime/lib/libcudart.so.12")]
    assert python_env_libraries([str(python)], "nccl") == [str(site / "nvidia/nccl/lib/libnccl.so.2")]


def test_paths_that_are_no_files_are_dropped(tmp_path: Path) -> None:
    real = tmp_path / "libcudart.so.13"
    real.write_bytes(b"\x7fELF")
    link = tmp_path / "libcudart.so"
    os.symlink(real, link)
    found = find_libraries("cudart", configured=[str(link), str(real), str(tmp_path / "gone/libcudart.so.13")],
                           use_ldconfig=False)
    assert found == [str(real)]  # one real path, the symlink resolved, the missing one gone


def test_conda_environment_lib_directory_is_searched(tmp_path: Path) -> None:
    # conda's cuda-cudart and nccl packages install into $CONDA_PREFIX/lib, beside lib/python3.X/site-packages
    env = tmp_path / "env"
    site = env / "lib/python3.11/site-packages"
    site.mkdir(parents=True)
    for name in ("libcudart.so.12.4.127", "libnccl.so.2.21.5", "libcublas.so.12"):
        (env / "lib" / name).write_bytes(b"\x7fELF")
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'print(\"{site}\"); print(\"prefix:{env}\")'\n")
    python.chmod(0o755)
    assert python_env_libraries([str(python)], "cudart") == [str(env / "lib/libcudart.so.12.4.127")]
    assert python_env_libraries([str(python)], "nccl") == [str(env / "lib/libnccl.so.2.21.5")]
    assert python_env_libraries([str(python)], "cuda_driver") == []  # the driver comes with the NVIDIA driver
