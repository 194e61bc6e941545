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
# node: tests/unit/report/test_report.py runs the HTML report's script
[ -z "$extras" ] || command -v node >/dev/null || need_apt=1
# chromium: tests/e2e/test_report_browser.py opens the HTML report in headless Chromium (offline)
[ -z "$extras" ] || command -v chromium >/dev/null || need_apt=1
# bpftool: tests/faults lists BPF programs to show a SIGKILLed agent left none (optional: it falls back to /proc)
command -v bpftool >/dev/null || [ -x /usr/sbin/bpftool ] || need_apt=1
/usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt=1
# sys/sdt.h (systemtap-sdt-dev): the tracepoints SDK's C extension (otel_ebpf/tracepoints/_oetp.c) and the NCCL
# profiler plugin (otel_ebpf/nccl_profiler/libnccl-profiler-otel_ebpf.so, built by `pip install -e .` below) need it
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
  [ -z "$extras" ] || command -v chromium >/dev/null || $SUDO apt-get install -y -qq chromium >/dev/null
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
# The twin (otel_ebpf/twin, docs/twin.md): the real torch CUDA wheel on stand-in libcudart/libnccl, in its own
# venv, since `import torch` there needs the stand-ins (tests/twin run it). torch goes in --no-deps: its CUDA
# dependencies are the very libraries the stand-ins replace, and torch's libraries name
# $ORIGIN/../../nvidia/*/lib in DT_RPATH, which the loader searches BEFORE LD_LIBRARY_PATH, so a real
# libcudart/libnccl in this venv would win over the stand-ins. For the same reason the CUDA runtime and NCCL
# wheels are only downloaded and their headers extracted (the stand-ins compile against the real prototypes).
# ~530 MB torch + ~200 MB NCCL wheel (pip's cache keeps them); a second run checks three paths and returns.
twin_torch=2.11.0
twin_site=".venv-twin/lib/python3.11/site-packages"
twin_inc=".venv-twin/twin-include"
# Installed also with --no-test-deps: `otel-ebpf demo` (scripts/demo.sh) and `otel-ebpf twin` run on it.
if [ ! -e "$twin_site/torch-$twin_torch.dist-info/METADATA" ] \
     || [ ! -e "$twin_inc/cuda/nv/target" ] || [ ! -e "$twin_inc/nccl/nccl.h" ]; then
  echo "setup: installing the twin's torch==$twin_torch (CUDA wheel) into .venv-twin" >&2
  [ -x .venv-twin/bin/python ] || /usr/bin/python3.11 -m venv .venv-twin
  .venv-twin/bin/python -m pip install -q --no-deps "torch==$twin_torch" filelock "typing-extensions>=4.10.0" \
    "sympy>=1.13.3" mpmath "networkx>=2.5.1" jinja2 MarkupSafe "fsspec>=0.8.5"
  # The NCCL torch was built against (its METADATA pins it); the CUDA 13.0 runtime headers of cuda-toolkit 13.0.2
  # (cuda_runtime_api.h; since CUDA 13 its crt/ includes ship in nvidia-cuda-crt, and nccl.h's cuda_fp16.h needs
  # CCCL's <nv/target>).
  nccl_pin=$(sed -n 's/^Requires-Dist: \(nvidia-nccl-cu13==[0-9.]*\).*/\1/p' "$twin_site/torch-$twin_torch.dist-info/METADATA")
  twin_dl=$(mktemp -d)
  .venv-twin/bin/python -m pip download -q --no-deps -d "$twin_dl" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.85" "${nccl_pin:?torch METADATA names no nvidia-nccl-cu13}"
  .venv-twin/bin/python - "$twin_dl" "$twin_inc" <<'EOF'
import pathlib, sys, zipfile
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wanted = {"nvidia/cu13/include/": dst / "cuda", "nvidia/nccl/include/nccl.h": dst / "nccl"}
for wheel in src.glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            for prefix, out in wanted.items():
                if name.startswith(prefix) and not name.endswith("/"):
                    rel = name[len(prefix):] if prefix.endswith("/") else pathlib.Path(name).name
                    (out / rel).parent.mkdir(parents=True, exist_ok=True)
                    (out / rel).write_bytes(z.read(name))
EOF
  rm -rf "$twin_dl"
fi
echo "setup: ok ($(.venv/bin/otel-ebpf --version))" >&2
