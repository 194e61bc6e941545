#!/usr/bin/env bash
# The GPU proof kit (docs/gpu-proof.md): otel-ebpf against real CUDA, NCCL, NVML and PyTorch on a GPU machine
# that has torch but no BCC and no network, in one command; the same steps on the twin as a dry run (CI).
#
#   scripts/gpu-proof.sh bundle [--python PY3.12]   HERE: make .gpu-proof/ (git-ignored; ~55 MiB) to carry along
#   scripts/gpu-proof.sh run [--quick] [--budget S] [--only STEPS]
#                                                   THERE: install .gpu-proof/ under $PREFIX, check eBPF, run all
#                                                   steps; results.json + results.md (+ log.txt) in $OUT
#   scripts/gpu-proof.sh run --twin [--quick]       HERE: the same steps on the twin (needs root, BCC, .venv-twin)
#   scripts/gpu-proof.sh install                    THERE: only the install (prints the agent's python)
#
# With the device tool:  run(command="scripts/gpu-proof.sh run", carry=[".gpu-proof"], timeout_s=600)
# Environment: OUT (results folder; default ./gpu-proof-out), PREFIX (default /tmp/otel-ebpf-gpu-proof),
# GPU_PROOF_BUDGET (seconds for the steps; default 480, so install + steps end inside a 10-minute command).
# Every step is bounded; nothing is left running (each step's processes are killed by process group, and the
# whole run by `timeout` at budget + 60 s).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-proof-out}
PREFIX=${PREFIX:-/tmp/otel-ebpf-gpu-proof}
BUNDLE=${GPU_PROOF_BUNDLE:-$ROOT/.gpu-proof}
BUDGET=${GPU_PROOF_BUDGET:-480}
cmd=${1:-}; shift || true

py312() {
  for p in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python; do
    command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null \
      && { command -v "$p"; return; }
  done
  echo "gpu-proof: no Python 3.12 here (needed to build the cp312 wheel); pass --python" >&2; exit 2
}

install() {
  [ -f "$BUNDLE/MANIFEST.json" ] || { echo "gpu-proof: no bundle at $BUNDLE: run 'scripts/gpu-proof.sh bundle' here and carry .gpu-proof" >&2; exit 2; }
  timeout 300 python3 bench/gpu_proof/bundle.py install --bundle "$BUNDLE" --prefix "$PREFIX" --python "$(command -v python3)" | tail -n1
}

case "$cmd" in
  bundle)
    pyver=""
    while [ $# -gt 0 ]; do case "$1" in --python) pyver=$2; shift 2;; *) echo "unknown: $1" >&2; exit 2;; esac; done
    [ -n "$pyver" ] || pyver=$(py312)
    host_py=$ROOT/.venv/bin/python; [ -x "$host_py" ] || host_py=python3
    "$host_py" bench/gpu_proof/bundle.py make --bundle "$BUNDLE" --python "$pyver"
    tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- | tail -n1 | cut -f1)
    bundle=$(du -sb "$BUNDLE" | cut -f1)
    echo "gpu-proof: working tree $((tree / 1048576)) MiB + bundle $((bundle / 1048576)) MiB = $(((tree + bundle) / 1048576)) MiB of the 64 MiB a call may carry"
    ;;
  install)
    install
    ;;
  run)
    twin=0; args=()
    while [ $# -gt 0 ]; do
      case "$1" in
        --twin) twin=1; shift;;
        --quick) args+=(--quick); shift;;
        --budget) BUDGET=$2; shift 2;;
        --only) args+=(--only "$2"); shift 2;;
        *) echo "unknown: $1" >&2; exit 2;;
      esac
    done
    mkdir -p "$OUT"
    [ "$(id -u)" -eq 0 ] || { echo "gpu-proof: run as root (BPF)" >&2; exit 3; }
    if [ "$twin" = 1 ]; then
      agent_py=$ROOT/.venv/bin/python
      [ -x "$agent_py" ] || { echo "gpu-proof: no .venv: run scripts/setup.sh" >&2; exit 3; }
      target=twin
    else
      start=$(date +%s)
      if [ -f "$BUNDLE/MANIFEST.json" ]; then
        if ! agent_py=$(install 2>"$OUT/install.log"); then
          cat "$OUT/install.log" >&2; echo "gpu-proof: install failed (log: $OUT/install.log)" >&2; exit 4
        fi
      else
        agent_py=$(command -v python3)  # a machine that has BCC and otel-ebpf already
      fi
      echo "gpu-proof: agent python $agent_py (install took $(( $(date +%s) - start )) s)" >&2
      # uprobes/kprobes go through perf_event_open, but BCC lists tracepoints and USDT through tracefs
      [ -e /sys/kernel/tracing/uprobe_events ] || [ -e /sys/kernel/debug/tracing/uprobe_events ] \
        || mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
      target=gpu
    fi
    set +e
    OUT=$OUT timeout --kill-after=15 $((BUDGET + 60)) "$agent_py" bench/gpu_proof/proof.py --target "$target" \
      --out "$OUT" --budget "$BUDGET" "${args[@]}" 2>&1 | tee "$OUT/log.txt"
    rc=${PIPESTATUS[0]}
    echo "gpu-proof: exit $rc; results in $OUT (results.md, results.json, log.txt)"
    exit "$rc"
    ;;
  *)
    sed -n '2,16p' "$0"; exit 2;;
esac
