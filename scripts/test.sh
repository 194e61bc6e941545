#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, then runs the whole suite.
# BPF tests need root; under CI=true they fail instead of skipping when eBPF cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check otel_ebpf tests bench  # the tests and benchmarks too: they are the code the claims rest on
.venv/bin/mypy otel_ebpf
.venv/bin/lint-imports --no-cache  # the layers in pyproject.toml [tool.importlinter] (docs/architecture.md, "Code layout")
if [ "$#" -gt 0 ]; then  # what was asked, in one run
  exec .venv/bin/python -m pytest -ra --durations=25 "$@"
fi
# The whole suite: everything but the idle_window tests (the slowest 25 named: CI stays under 45 minutes), then
# those side by side, a worker each (pytest-xdist; tests/conftest.py keeps them in tests/faults). Each waits out a
# 30-60 s fault window its issue sets, with little CPU, so together they take about as long as the longest
# (measured on a 2-core VM, four runs: 88-94 s for the four, 276 s one after another).
rc=0
.venv/bin/python -m pytest -ra --durations=25 -m "not idle_window" || rc=$?
.venv/bin/python -m pytest -ra --durations=4 -m idle_window -n 4 tests/faults || { r=$?; [ "$rc" -ne 0 ] || rc=$r; }
exit "$rc"
