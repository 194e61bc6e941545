#!/usr/bin/env bash
# The main job (README's first command): install, check the host, then run `otel-ebpf demo`:
# a simulated 2-node x 2-rank data-parallel training job (network + UTS namespaces as nodes, one
# agent per node, the gateway joining every NCCL collective across ranks, rank 3 a straggler).
# Ranks drive the real CUDA runtime and a stand-in libnccl; no GPU is needed.
# Leaves OTLP JSON lines in ./otel-ebpf-demo-out/ (or $1) and prints what it found.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-./otel-ebpf-demo-out}"
bash scripts/setup.sh
.venv/bin/otel-ebpf check || { echo "demo: this host cannot run eBPF (see above)" >&2; exit 3; }
exec .venv/bin/otel-ebpf demo --nodes 2 --ranks-per-node 2 --steps 20 --straggler 3 --output "$out"
