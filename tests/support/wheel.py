"""The package as a user installs it: a wheel built from exactly what deploy/Dockerfile copies into
its build directory, and fresh virtual environments outside the checkout to install it into.

Used by tests/e2e/test_wheel.py (the wheel, its contents, the CLI from it) and tests/e2e/test_floors.py
(the declared dependency floors). Nothing here imports otel_ebpf: the point is to test what the
wheel holds, not what the checkout holds.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
#: source folder -> installed package path (every package is under otel_ebpf/, setup.py)
PACKAGE_DIRS = {"otel_ebpf": "otel_ebpf"}
#: what .gitignore keeps out of the source folders: build outputs, never sources
_IGNORED_DIRS = {"__pycache__"}
_IGNORED_SUFFIXES = (".pyc", ".so")
#: the system Python BCC (Debian's python3-bpfcc) is importable from, as scripts/setup.sh and the Dockerfile use
SYSTEM_PYTHON = "/usr/bin/python3"


def dockerfile_sources() -> list[str]:
    """The paths deploy/Dockerfile copies into its build directory (``COPY ... ./...`` lines) before
    ``pip install .``: the wheel is built from these and nothing else."""
    out = []
    for line in DOCKERFILE.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and parts[-1].startswith("./"):
            out += parts[1:-1]
    return out


def source_files() -> list[Path]:
    """Every file in the package source folders that is not a build output, relative to ROOT."""
    files = []
    for top in PACKAGE_DIRS:
        for dirpath, dirnames, filenames in os.walk(ROOT / top):
            dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED_DIRS and not d.endswith(".egg-info"))
            files += [Path(dirpath, f).relative_to(ROOT) for f in sorted(filenames)
                      if not f.endswith(_IGNORED_SUFFIXES)]
    return files


def installed_path(src: Path) -> str:
    """Where a source file lands in the wheel (the same path: every package is under otel_ebpf/)."""
    top, *rest = src.parts
    return "/".join([PACKAGE_DIRS[top], *rest])


def build_wheel(work: Path, python: str = sys.executable) -> Path:
    """Copy what the Dockerfile copies (build outputs left out, as .gitignore and the
    .dockerignore do) into ``work/src`` and build the wheel there with ``pip wheel --no-deps``
    (isolated build: setuptools from the index or pip's cache, as on a user's machine). The
    checkout is never written to. Returns the wheel's path."""
    src = work / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info")
    for name in dockerfile_sources():
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    out = work / "dist"
    run([python, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)], cwd=work, timeout=300)
    (wheel,) = out.glob("otel_ebpf-*.whl")
    return wheel


def fresh_venv(path: Path, system_site_packages: bool = True) -> Path:
    """A new venv from the system Python, with ``--system-site-packages`` (so ``import bcc`` works,
    as in scripts/setup.sh and deploy/Dockerfile) unless told otherwise. Returns its bin folder."""
    args = [SYSTEM_PYTHON, "-m", "venv", *(["--system-site-packages"] if system_site_packages else []), str(path)]
    run(args, cwd=path.parent, timeout=120)
    return path / "bin"


def clean_env() -> dict[str, str]:
    """The environment for commands in a fresh venv: nothing that points back into the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP") and not k.startswith("OTEL_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not p.startswith(str(ROOT)))
    return {**env, "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}


def run(args: list[str], cwd: Path, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command with :func:`clean_env`; on failure (``check``) raise with its output."""
    r = subprocess.run(args, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {r.returncode}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    return r
