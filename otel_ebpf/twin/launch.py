"""Runs a torchrun program on N simulated GPUs: the real torch of the twin's venv on the stand-in libraries.

One host for now (the demo's network-namespace nodes come later). ``launch`` builds the libraries if needed
(``build.build``), then runs ``python -m torch.distributed.run --standalone --nproc-per-node N script args``
with ``LD_LIBRARY_PATH`` on them, ``OTEL_EBPF_TWIN_GPUS=N`` (the stand-in CUDA runtime's device count), and a
fresh ``OTEL_EBPF_TWIN_DIR`` holding the communicators' shared-memory staging files. The whole process group
is killed at the timeout, and that directory is removed whatever happens.

Blocking; safe to call from several threads (each run has its own directory; ``--standalone`` picks a free
rendezvous port). Raises ``TwinSetupError``/``TwinBuildError`` before anything runs; a failing program is a
result (``TwinRun.returncode``), not an exception.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from otel_ebpf.twin.build import build
from otel_ebpf.twin.env import TwinEnv, find_env

__all__ = ["TwinRun", "launch", "twin_environment"]


@dataclass(frozen=True)
class TwinRun:
    """The outcome of one twin run. ``returncode`` is torchrun's: 0 when every rank exited 0; -9 when killed
    at the timeout (``timed_out``). ``output`` is stdout and stderr of torchrun and all ranks, interleaved."""

    returncode: int
    output: str
    timed_out: bool
    seconds: float


def twin_environment(libdir: Path, nproc: int, rendezvous_dir: Path,
                     extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a twin run: the caller's, plus the stand-ins first on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    env.update(extra or {})
    prior = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = f"{libdir}:{prior}" if prior else str(libdir)
    env["OTEL_EBPF_TWIN_GPUS"] = str(nproc)
    env["OTEL_EBPF_TWIN_DIR"] = str(rendezvous_dir)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default, set here to skip its warning
    return env


def _scratch_root() -> str | None:
    """/dev/shm when there is one: the staging files are memory, not disk."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def launch(script: Path | str, nproc: int, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
           timeout: float = 300.0, cwd: Path | None = None, twin: TwinEnv | None = None,
           cache_dir: Path | None = None) -> TwinRun:
    """Runs ``script`` under torchrun with ``nproc`` ranks, one simulated GPU each, within ``timeout`` seconds."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    twin = twin or find_env()
    libdir = build(twin, cache_dir)
    rendezvous = Path(tempfile.mkdtemp(prefix="otel-ebpf-twin-", dir=_scratch_root()))
    cmd = [str(twin.python), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(script), *args]
    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                env=twin_environment(libdir, nproc, rendezvous, env), start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            return TwinRun(proc.returncode, out, False, time.monotonic() - start)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and every rank: they share its new session
            out, _ = proc.communicate()
            return TwinRun(-signal.SIGKILL, out, True, time.monotonic() - start)
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)

