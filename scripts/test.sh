#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, then runs the whole suite.
# BPF tests need root; under CI=true they fail instead of skipping when eBPF cannot run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check otel_ebpf
.venv/bin/mypy otel_ebpf
.venv/bin/lint-imports --no-cache  # the layers in pyproject.toml [tool.importlinter] (docs/architecture.md, "Code layout")
exec .venv/bin/python -m pytest -ra --durations=25 "$@"  # the slowest 25: CI stays under 45 minutes
