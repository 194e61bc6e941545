#!/usr/bin/env bash
# The main job (README's first command): install (the package and the twin's torch, not the test
# extras), check the host, then run `otel-ebpf demo`: a real PyTorch FSDP2 + tensor-parallel job on
# simulated GPUs, 2 nodes x 2 ranks (network + UTS namespaces as nodes, one agent per node, the
# gateway joining every NCCL collective of every communicator, rank 3 a straggler). No GPU is
# needed: kernels do nothing and timing is host timing.
# Leaves OTLP JSON lines in ./otel-ebpf-demo-out/ (or $1) and prints what it found.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-./otel-ebpf-demo-out}"
bash scripts/setup.sh --no-test-deps
.venv/bin/otel-ebpf check || { echo "demo: this host cannot run eBPF (see above)" >&2; exit 3; }
exec .venv/bin/otel-ebpf demo --nodes 2 --ranks-per-node 2 --steps 20 --straggler 3 --output "$out"
