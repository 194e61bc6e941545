#!/usr/bin/env bash
# The main job (README's first command): install, check the host, and trace a bundled
# training-step workload that drives the real CUDA runtime. Leaves OTLP JSON lines in
# ./otel-ebpf-out/ (or $1).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-./otel-ebpf-out}"
bash scripts/setup.sh
.venv/bin/otel-ebpf check || { echo "demo: this host cannot run eBPF (see above)" >&2; exit 3; }
rm -rf "$out"
.venv/bin/otel-ebpf run --output "$out" -- .venv/bin/python examples/cuda_training_sim.py --steps 20
echo "demo: traces in $out/traces.jsonl, metrics in $out/metrics.jsonl"
