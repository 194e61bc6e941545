"""The GPU proof kit's bundle: made HERE (network, apt, Python 3.12), installed THERE (no network, no BCC).

``make(out)`` fills ``out`` (default ``.gpu-proof/``, git-ignored) with what a GPU machine lacks:

* ``bcc-libs.tar.xz``: Debian 12's ``libbcc.so.0`` (BCC 0.26) and every library it needs beyond glibc/libstdc++
  (LLVM 14, clang-cpp 14, z3, ICU 72, libxml2, libelf, libbpf, ...), taken from the ``.deb`` files with
  ``dpkg-deb -x`` into a scratch folder (never over ``/``);
* ``bcc-rest.tar.xz``: the ``bcc`` Python package (pure Python: ctypes on libbcc.so.0) and the kernel headers
  the project links today (Debian's linux-headers-6.1 amd64 + common, merged into one tree and trimmed to the
  folders BCC's include path reaches: BCC is pointed at it with ``BCC_KERNEL_SOURCE``);
* ``wheels/``: our own wheel built with Python 3.12 (cp312: the tracepoints extension and the NCCL profiler
  plugin built here) and our pure-Python dependencies (cp312 manylinux); grpcio is left out (7 MB; the GPU image
  has it, ``install`` checks its version);
* ``MANIFEST.json``: every file's size and sha256, the deb versions.

``install(bundle, prefix)`` unpacks under ``prefix`` (default /tmp/otel-ebpf-gpu-proof), makes a venv from the
machine's python3 that also sees that python's own site-packages (torch, grpcio, ...), installs the wheels with
``pip --no-index --no-deps``, and adds a start-up hook (``_gpu_proof_preload.pth``) that loads the bundled
libraries by absolute path, in dependency order, only into processes of that venv: a library the system already
has (libz, libxml2, ...) is taken from the system, the BCC/LLVM chain always from the bundle. Nothing is written
outside ``prefix``; the traced workloads run on the machine's own python and never see these libraries.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["DEBS", "LIBS", "install", "make"]

ROOT = Path(__file__).resolve().parents[2]
# Debian 12 packages: BCC 0.26 and the closure of libbcc.so.0's DT_NEEDED beyond glibc, libstdc++ and libgcc_s
# (newer on the Ubuntu 24.04-like GPU image), plus the headers scripts/setup.sh links today.
DEBS = ["libbpfcc", "python3-bpfcc", "libclang-cpp14", "libllvm14", "libelf1", "libbpf1", "libz3-4", "libffi8",
        "libedit2", "libtinfo6", "libxml2", "libicu72", "libbsd0", "libmd0", "liblzma5", "zlib1g"]
HEADERS = ("linux-headers-6.1.0-56-amd64", "linux-headers-6.1.0-56-common")
# Load order (leaves first); ALWAYS_OURS are loaded from the bundle even when the system has the soname.
LIBS = ["libmd.so.0", "libbsd.so.0", "libtinfo.so.6", "libedit.so.2", "libffi.so.8", "libz.so.1", "liblzma.so.5",
        "libicudata.so.72", "libicuuc.so.72", "libxml2.so.2", "libz3.so.4", "libelf.so.1", "libbpf.so.1",
        "libLLVM-14.so.1", "libclang-cpp.so.14", "libbcc.so.0"]
ALWAYS_OURS = ("libz3.so.4", "libLLVM-14.so.1", "libclang-cpp.so.14", "libbcc.so.0", "libbpf.so.1")
# Folders of the merged header tree BCC's -I/-include flags reach (kbuild_helper.cc): the project's programs
# include <uapi/linux/ptrace.h> and BCC's helpers.h; 163 files under these were opened compiling all receivers.
HEADER_DIRS = ("include/linux", "include/uapi", "include/asm-generic", "include/generated", "include/vdso",
               "arch/x86/include")
WHEELS = ["opentelemetry-api>=1.45.0", "opentelemetry-sdk>=1.45.0", "opentelemetry-semantic-conventions>=0.66b0",
          "opentelemetry-exporter-otlp-proto-grpc>=1.45.0", "opentelemetry-exporter-otlp-proto-http>=1.45.0",
          "opentelemetry-exporter-otlp-proto-common>=1.45.0", "opentelemetry-proto>=1.45.0",
          "opentelemetry-exporter-prometheus>=0.66b0", "protobuf>=5.26.1", "googleapis-common-protos>=1.63.1",
          "prometheus-client>=0.20.0", "psutil>=5.9.4", "PyYAML>=6", "nvidia-ml-py>=12.535.77", "py-spy>=0.4.1"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_12_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64"]


def _run(cmd: list[str], timeout: float, **kw: object) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, timeout=timeout, **kw)  # type: ignore[call-overload]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _debs(scratch: Path) -> dict[str, str]:
    debs = scratch / "debs"
    debs.mkdir()
    _run(["apt-get", "download", *DEBS, *HEADERS], timeout=600, cwd=debs)
    root = scratch / "root"
    versions = {}
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(root)], timeout=120)
        versions[deb.name.split("_")[0]] = deb.name.split("_")[1].replace("%3a", ":")
    return versions


def _tree(scratch: Path) -> tuple[Path, Path]:
    root, libs, rest = scratch / "root", scratch / "libs", scratch / "rest"
    (libs / "lib").mkdir(parents=True)
    for so in LIBS:
        dirs = (root / "usr/lib/x86_64-linux-gnu", root / "lib/x86_64-linux-gnu")
        found = [d / so for d in dirs if (d / so).exists()]
        if not found:
            raise SystemExit(f"bundle: {so} is in none of the debs")
        shutil.copy2(found[0], libs / "lib" / so, follow_symlinks=True)
    (rest / "python").mkdir(parents=True)
    shutil.copytree(root / "usr/lib/python3/dist-packages/bcc", rest / "python/bcc")
    arch, common = (root / "usr/src" / h for h in HEADERS)
    kh = rest / "kernel-headers"
    for d in HEADER_DIRS:  # common first, then the amd64 package's generated files over it
        for src in (common / d, arch / d):
            if src.exists():
                shutil.copytree(src, kh / d, dirs_exist_ok=True, symlinks=False)
    return libs, rest


def _xz(src: Path, dst: Path, x86: bool) -> None:
    filt = "--x86 --lzma2=preset=9e" if x86 else "-9e"
    _run(["bash", "-c", f"tar -C '{src}' -cf - . | xz -T0 {filt} > '{dst}'"], timeout=1800)


def _wheels(out: Path, python312: str) -> None:
    wheels = out / "wheels"
    wheels.mkdir()
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    _run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
          "--implementation", "cp", *plat, "-d", str(wheels), *WHEELS], timeout=600)
    for w in wheels.glob("grpcio-*.whl"):  # the image has grpcio; 7 MB we cannot spare
        w.unlink()
    with tempfile.TemporaryDirectory(prefix="gpu-proof-src-") as src:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                               capture_output=True, timeout=60).stdout.decode().split("\0")
        for f in filter(None, files):
            if (ROOT / f).is_file():
                (Path(src) / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / f, Path(src) / f)
        _run([python312, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), src], timeout=600)


def make(out: Path, python312: str) -> dict[str, object]:
    """Make the bundle in ``out`` (replaced). Needs apt-get, dpkg-deb, xz, the network, a Python 3.12."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpu-proof-bundle-") as tmp:
        scratch = Path(tmp)
        versions = _debs(scratch)
        libs, rest = _tree(scratch)
        _xz(libs, out / "bcc-libs.tar.xz", x86=True)
        _xz(rest, out / "bcc-rest.tar.xz", x86=False)
    _wheels(out, python312)
    files = {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(out.rglob("*")) if p.is_file()}
    manifest = {"debs": versions, "libs": LIBS, "header_dirs": list(HEADER_DIRS), "files": files,
                "total_bytes": sum(int(f["bytes"]) for f in files.values())}  # type: ignore[call-overload]
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return manifest


_PRELOAD = '''"""Written by bench/gpu_proof/bundle.py: load the bundled BCC chain into this venv's processes only."""
import ctypes, os, sys
_DIR = {libdir!r}
for _so in {libs!r}:
    try:
        if _so not in {always!r}:
            try:
                ctypes.CDLL(_so, mode=ctypes.RTLD_GLOBAL)
                continue
            except OSError:
                pass
        ctypes.CDLL(os.path.join(_DIR, _so), mode=ctypes.RTLD_GLOBAL)
    except OSError as _exc:
        print(f"gpu-proof preload: {{_so}}: {{_exc}}", file=sys.stderr)
if not os.path.isdir("/lib/modules/%s/build/include" % os.uname().release):
    os.environ.setdefault("BCC_KERNEL_SOURCE", {headers!r})
'''


def _site(python: str, venv: bool) -> list[str]:
    code = ("import json, site, sys; print(json.dumps(site.getsitepackages() if %s else "
            "[p for p in sys.path if p.endswith('-packages')]))")
    r = subprocess.run([python, "-c", code % venv], check=True, capture_output=True, text=True, timeout=60)
    return [p for p in json.loads(r.stdout) if os.path.isdir(p)]


def preflight() -> list[str]:
    """What this machine lacks that the bundled libraries need: Debian 12's builds ask for glibc >= 2.36
    (libLLVM-14) and a libstdc++ with GLIBCXX_3.4.30 (GCC 12; objdump -T of libLLVM, libclang-cpp, libz3)."""
    import ctypes.util

    problems = []
    glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    parts = glibc.split()[-1].split(".") if glibc else []
    if not glibc.startswith("glibc") or tuple(int(p) for p in parts[:2]) < (2, 36):
        problems.append(f"glibc >= 2.36 needed (libLLVM-14 of Debian 12), this machine has {glibc or 'none'}")
    lib = ctypes.util.find_library("stdc++")
    paths = [p for p in ("/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
             if os.path.exists(p)]
    if not paths or b"GLIBCXX_3.4.30" not in Path(paths[0]).read_bytes():
        problems.append(f"libstdc++ with GLIBCXX_3.4.30 (GCC 12) needed; found {paths or lib}")
    return problems


def _make_venv(python: str, venv: Path) -> None:
    """``python -m venv --without-pip``; where the venv module refuses (a distribution python without its venv
    package), the same by hand: pyvenv.cfg naming the base interpreter's folder, bin/python linked to it."""
    try:
        _run([python, "-m", "venv", "--without-pip", str(venv)], timeout=120)
        return
    except subprocess.CalledProcessError:
        print("install: python -m venv failed; making the venv by hand", file=sys.stderr)
    code = "import sys; print(getattr(sys, '_base_executable', sys.executable)); print('%d.%d' % sys.version_info[:2])"
    base, ver = subprocess.run([python, "-c", code], check=True, capture_output=True, text=True,
                               timeout=60).stdout.split()
    base = os.path.realpath(base)
    shutil.rmtree(venv, ignore_errors=True)
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / f"python{ver}" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {os.path.dirname(base)}\ninclude-system-site-packages = false\n"
                                     f"version = {ver}\n")
    (venv / "bin" / "python").symlink_to(base)


def install(bundle: Path, prefix: Path, python: str) -> Path:
    """Install ``bundle`` under ``prefix`` for ``python``; return the venv's python. Idempotent per bundle."""
    for problem in preflight():
        print(f"install: WARNING {problem}: libbcc.so.0 will not load", file=sys.stderr)
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    for name, meta in manifest["files"].items():
        if _sha256(bundle / name) != meta["sha256"]:
            raise SystemExit(f"install: {name} does not match MANIFEST.json (truncated carry?)")
    if prefix.exists():
        shutil.rmtree(prefix)
    prefix.mkdir(parents=True)
    for tar in ("bcc-libs.tar.xz", "bcc-rest.tar.xz"):
        _run(["tar", "-C", str(prefix), "-xJf", str(bundle / tar)], timeout=300)
    image_site = _site(python, venv=False)
    venv = prefix / "venv"
    _make_venv(python, venv)
    vpy = venv / "bin" / "python"
    site_dir = Path(_site(str(vpy), venv=True)[0])
    # the venv's own site first (our wheels shadow the image's copies), then the image's (torch, grpcio, ...)
    (site_dir / "zz_gpu_proof_image.pth").write_text("\n".join([str(prefix / "python"), *image_site]) + "\n")
    (site_dir / "_gpu_proof_preload.py").write_text(_PRELOAD.format(
        libdir=str(prefix / "lib"), libs=manifest["libs"], always=list(ALWAYS_OURS),
        headers=str(prefix / "kernel-headers")))
    (site_dir / "_gpu_proof_preload.pth").write_text("import _gpu_proof_preload\n")
    wheels = sorted(str(w) for w in (bundle / "wheels").glob("*.whl"))
    _run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
          "--target", str(site_dir), *wheels], timeout=300)
    return vpy


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="gpu-proof bundle|install")
    ap.add_argument("action", choices=["make", "install"])
    ap.add_argument("--bundle", type=Path, default=ROOT / ".gpu-proof")
    ap.add_argument("--prefix", type=Path, default=Path("/tmp/otel-ebpf-gpu-proof"))
    ap.add_argument("--python", default="python3", help="make: a Python 3.12; install: the machine's python")
    a = ap.parse_args(argv)
    if a.action == "make":
        m = make(a.bundle, a.python)
        for name, meta in m["files"].items():  # type: ignore[attr-defined]
            print(f"{meta['bytes'] / 2**20:8.2f} MiB  {name}")
        print(f"bundle: {a.bundle}: {int(m['total_bytes']) / 2**20:.2f} MiB in all "  # type: ignore[call-overload]
              f"(carry it: the working tree + carried paths must stay under 64 MiB)")
    else:
        print(install(a.bundle, a.prefix, a.python))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
