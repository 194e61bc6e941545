"""Hypothesis profiles for the fuzz suite: ``ci`` (the default: each target runs in seconds) and
``soak`` (many more examples). Choose soak with ``pytest tests/fuzz --soak`` or, when pytest is run
from the repository root (``pytest tests``, where this conftest is not an initial one and cannot
add options), with the environment variable ``OTEL_EBPF_SOAK=1``."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

CI_EXAMPLES = 200
SOAK_EXAMPLES = 20_000
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=CI_EXAMPLES, deadline=None, print_blob=True,
                          suppress_health_check=_SUPPRESS)
settings.register_profile("soak", max_examples=SOAK_EXAMPLES, deadline=None, print_blob=True,
                          suppress_health_check=_SUPPRESS)


def pytest_addoption(parser: pytest.Parser) -> None:
    try:
        parser.addoption("--soak", action="store_true", default=False,
                         help="long soak variants of the fault and fuzz suites (tests/faults, tests/fuzz)")
    except ValueError:  # tests/faults/conftest.py added it already
        pass


def soak_enabled(config: pytest.Config) -> bool:
    return bool(os.environ.get("OTEL_EBPF_SOAK")) or bool(config.getoption("--soak", default=False))


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("soak" if soak_enabled(config) else "ci")
