"""The twin's build: stand-ins and stubs from the installed wheel, cached, checked against torch's imports."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv, TwinSetupError, build, find_env
from otel_ebpf.twin.stubs import plan_stubs, undefined_symbols


def _exports(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.split()}


def test_build_makes_every_library_torch_needs_and_is_cached(twin: TwinEnv, tmp_path: Path) -> None:
    first = build(twin, tmp_path)
    names = {p.name for p in first.iterdir()}
    assert {"libcudart.so.13", "libnccl.so.2"} <= names
    assert set(plan_stubs(twin.torch_dir)) <= names and "libcublas.so.13" in names
    stamp = (first / "libnccl.so.2").stat().st_mtime_ns
    start = time.monotonic()
    again = build(twin, tmp_path)
    assert again == first and (again / "libnccl.so.2").stat().st_mtime_ns == stamp
    assert time.monotonic() - start < 5, "a cached build must not recompile"
    assert [p.name for p in tmp_path.iterdir()] == [first.name], "no leftover temporary build"


def test_stand_ins_export_the_real_versioned_names(libdir: Path, twin: TwinEnv) -> None:
    cudart = _exports(libdir / "libcudart.so.13")
    assert "cudaMalloc@@libcudart.so.13" in cudart  # the version node torch's import names
    nccl = _exports(libdir / "libnccl.so.2")
    assert {"ncclCommSplit", "pncclCommSplit", "ncclAllReduce"} <= nccl
    assert not any(n.startswith("twin_") for n in nccl), "internal helpers stay hidden"
    imported = {s for lib in (twin.torch_dir / "lib").glob("libtorch_cuda.so") for s in undefined_symbols(lib)}
    assert "ncclCommSplit" in imported and "cudaMalloc@libcudart.so.13" in imported


def test_torch_imports_on_the_stand_ins(libdir: Path, twin: TwinEnv) -> None:
    code = ("import torch; print(torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.nccl.version());"
            "print(torch.tensor([1.5, 2.5]).to('cuda').cpu().tolist())")
    r = subprocess.run([str(twin.python), "-c", code], capture_output=True, text=True, timeout=120,
                       env={"LD_LIBRARY_PATH": str(libdir), "OTEL_EBPF_TWIN_GPUS": "3", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["True 3 (2, 28, 9)", "[1.5, 2.5]"], r.stdout


def test_missing_environment_names_the_torch_version(tmp_path: Path) -> None:
    with pytest.raises(TwinSetupError, match=r"torch==2\.11\.0") as err:
        find_env(tmp_path / "nowhere")
    assert "scripts/setup.sh" in str(err.value)
