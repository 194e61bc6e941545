"""Fixtures of the fault suite. ``--soak`` (or ``OTEL_EBPF_SOAK=1`` when pytest runs from the
repository root and cannot take this folder's options) selects the long variants."""
from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    try:
        parser.addoption("--soak", action="store_true", default=False,
                         help="long soak variants of the fault and fuzz suites (tests/faults, tests/fuzz)")
    except ValueError:  # tests/fuzz/conftest.py added it already
        pass


@pytest.fixture(scope="session")
def soak(request: pytest.FixtureRequest) -> bool:
    return bool(os.environ.get("OTEL_EBPF_SOAK")) or bool(request.config.getoption("--soak", default=False))
