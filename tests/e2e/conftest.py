"""Fixtures for the installed package: the wheel is built once per session (tests/support/wheel.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.wheel import build_wheel


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """otel-ebpf's wheel, built from what deploy/Dockerfile copies, in a folder outside the checkout."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))
