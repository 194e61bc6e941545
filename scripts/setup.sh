#!/usr/bin/env bash
# Installs everything otel-ebpf needs on a fresh Debian/Ubuntu machine, idempotently:
#   apt:  python3-bpfcc (BCC lives in the distribution's /usr/bin/python3), kernel headers, a C compiler,
#         prometheus (the real server tests/e2e/test_prometheus.py scrapes the agent with; Debian 12 has it)
#   pip:  the package and its test extras into .venv (made from /usr/bin/python3 --system-site-packages
#         so that `import bcc` works inside it).
# When the running kernel has no headers package (custom/cloud kernels), the distribution's generic
# headers are linked as /lib/modules/$(uname -r)/{build,source}; BCC only needs them to compile.
# Usage: scripts/setup.sh [--no-test-deps]
set -euo pipefail
cd "$(dirname "$0")/.."
extras="[test]"
[ "${1:-}" = "--no-test-deps" ] && extras=""
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

need_apt=0
/usr/bin/python3 -c 'import bcc' 2>/dev/null || need_apt=1
command -v cc >/dev/null || need_apt=1
command -v prometheus >/dev/null || need_apt=1
# node: tests/unit/test_report.py runs the HTML report's script
[ -z "$extras" ] || command -v node >/dev/null || need_apt=1
# bpftool: tests/faults lists BPF programs to show a SIGKILLed agent left none (optional: it falls back to /proc)
command -v bpftool >/dev/null || [ -x /usr/sbin/bpftool ] || need_apt=1
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt=1
# sys/sdt.h (systemtap-sdt-dev): the tracepoints SDK's C extension (otel_ebpf/tracepoints/_oetp.c) needs it
echo '#include <sys/sdt.h>' | cc -E -x c - >/dev/null 2>&1 || need_apt=1
kdir="/lib/modules/$(uname -r)"
[ -e "$kdir/build/include" ] || need_apt=1
if [ "$need_apt" = 1 ]; then
  echo "setup: installing system packages (python3-bpfcc, kernel headers, gcc, prometheus)" >&2
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq python3-bpfcc gcc make python3-venv ca-certificates systemtap-sdt-dev >/dev/null
  # No recommends: the tests run their own prometheus on loopback, not the packaged exporters.
  command -v prometheus >/dev/null || $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  [ -z "$extras" ] || command -v node >/dev/null || $SUDO apt-get install -y -qq --no-install-recommends nodejs >/dev/null
  [ -x /usr/sbin/bpftool ] || $SUDO apt-get install -y -qq bpftool >/dev/null 2>&1 || true  # Ubuntu: linux-tools
  # Headers for exactly this kernel when the distribution has them, else the generic ones.
  if ! $SUDO apt-get install -y -qq "linux-headers-$(uname -r)" >/dev/null 2>&1; then
    $SUDO apt-get install -y -qq linux-headers-amd64 >/dev/null 2>&1 \
      || $SUDO apt-get install -y -qq linux-headers-generic >/dev/null 2>&1 || true
  fi
fi

if [ ! -e "$kdir/build/include" ]; then
  # Pick the newest installed generic headers (Debian: linux-headers-X-amd64 + linux-headers-X-common).
  arch_dir=$(ls -d /usr/src/linux-headers-*-amd64 /usr/src/linux-headers-*-arm64 /usr/src/linux-headers-*-generic 2>/dev/null | sort -V | tail -n1 || true)
  if [ -n "$arch_dir" ]; then
    common_dir="${arch_dir%-*}-common"
    [ -d "$common_dir" ] || common_dir="$arch_dir"
    echo "setup: kernel $(uname -r) has no headers; linking $arch_dir (build) and $common_dir (source)" >&2
    $SUDO mkdir -p "$kdir"
    $SUDO ln -sfn "$arch_dir" "$kdir/build"
    $SUDO ln -sfn "$common_dir" "$kdir/source"
  else
    echo "setup: WARNING no kernel headers found; 'otel-ebpf check' explains how to fix this" >&2
  fi
fi

# tracefs is where uprobes are registered; some VMs do not mount it.
if [ ! -e /sys/kernel/tracing/uprobe_events ] && [ ! -e /sys/kernel/debug/tracing/uprobe_events ]; then
  $SUDO mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || true
fi

if [ ! -x .venv/bin/python ]; then
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# The torch receiver's tests need PyTorch; PyPI's Linux wheel would pull ~3 GB of CUDA libraries, so the CPU
# build comes first from PyTorch's CPU index (local find-links/indexes still apply), and satisfies the test extra.
# A local CPU wheel (pip's configured find-links) is tried first: no network needed when it is there.
if [ -n "$extras" ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
    || .venv/bin/python -m pip install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
         --extra-index-url https://pypi.org/simple
fi
.venv/bin/python -m pip install -q -e ".${extras}"
# tests/unit/test_deploy.py: the compose-spec schema, from Docker's docker-compose wheel (downloaded, not installed)
[ -z "$extras" ] || .venv/bin/python -m tests.support.compose_schema --fetch >/dev/null \
  || echo "setup: WARNING compose schema not fetched; test_deploy's compose schema test fails in CI" >&2
echo "setup: ok ($(.venv/bin/otel-ebpf --version))" >&2
