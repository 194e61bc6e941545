"""Shared fixtures. BPF tests need root + BCC + kernel headers: in CI (CI=true) a missing
piece FAILS the test, so nothing that should run is silently skipped; elsewhere it skips
with the reason. GPU tests skip without a GPU and say so."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


#: where idle_window tests live: scripts/test.sh leaves them out of the suite's run and runs this folder's side by side
IDLE_WINDOW_DIR = "tests/faults/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An idle_window test outside IDLE_WINDOW_DIR would never run under scripts/test.sh: refuse it."""
    stray = [i.nodeid for i in items
             if i.get_closest_marker("idle_window") and not i.nodeid.startswith(IDLE_WINDOW_DIR)]
    if stray:
        raise pytest.UsageError(f"idle_window tests must be under {IDLE_WINDOW_DIR} (scripts/test.sh): {stray}")


def _bpf_problem() -> str | None:
    from otel_ebpf.core.errors import OtelEbpfError

    try:
        from otel_ebpf.bpf.loader import require_bpf

        require_bpf()
    except OtelEbpfError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="session")
def bpf_ready() -> None:
    """Use in every test that loads BPF programs."""
    problem = _bpf_problem()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"BPF tests must run in CI but cannot: {problem}")
    pytest.skip(f"needs root, BCC and kernel headers: {problem}")


@pytest.fixture(scope="session")
def built() -> dict[str, Path]:
    """The C test programs (cuda_driver, nccl_rank, stand-in libnccl), compiled once."""
    from tests.support.build import build_all

    return build_all()


@pytest.fixture(scope="session")
def cudart() -> Path:
    """The REAL CUDA runtime from the nvidia-cuda-runtime-cu12 wheel (a test dependency)."""
    from tests.support.build import real_cudart

    path = real_cudart()
    if path is None:
        pytest.fail("nvidia-cuda-runtime-cu12 is a test dependency and must be installed")
    return path
