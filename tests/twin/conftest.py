"""Fixtures of the twin's tests: the twin's environment (scripts/setup.sh makes .venv-twin). Under CI=true a
missing environment FAILS, so the twin's tests cannot be skipped silently there; elsewhere they skip."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv, TwinSetupError, build, find_env

PROGRAMS = Path(__file__).resolve().parent / "programs"


@pytest.fixture(scope="session")
def twin() -> TwinEnv:
    try:
        return find_env()
    except TwinSetupError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the twin's tests must run in CI but cannot: {exc}")
        pytest.skip(f"no twin environment: {exc}")


@pytest.fixture(scope="session")
def twin_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the session's runs (the first test that needs it builds)."""
    return tmp_path_factory.mktemp("twin-cache")


@pytest.fixture(scope="session")
def libdir(twin: TwinEnv, twin_cache: Path) -> Path:
    return build(twin, twin_cache)
