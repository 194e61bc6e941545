"""Ship what we test: the wheel (built from what deploy/Dockerfile copies), installed with its
dependencies into a fresh venv outside the checkout (``--system-site-packages`` from
/usr/bin/python3 for BCC, as scripts/setup.sh and the Dockerfile do), run from a folder outside
the checkout. The rest of the suite runs against the editable install, which sees every file of
the checkout whether the wheel ships it or not.
"""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support.wheel import PACKAGE_DIRS, ROOT, fresh_venv, installed_path, run, source_files


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv's bin folder, the wheel installed in it with its declared dependencies."""
    bin_dir = fresh_venv(tmp_path_factory.mktemp("wheel-venv") / "venv")
    run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=wheel.parent, timeout=600)
    return bin_dir


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory outside the checkout: nothing can be imported from the current folder."""
    return tmp_path


def test_wheel_ships_every_package_and_every_runtime_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = source_files()
    packages = sorted({s.parent for s in sources if s.suffix == ".py"})
    missing_init = [str(p) for p in packages if f"{installed_path(p / '__init__.py')}" not in names]
    assert not missing_init, f"folders with Python modules but no __init__.py in the wheel: {missing_init}"
    missing = [str(s) for s in sources if installed_path(s) not in names]
    assert not missing, f"source files the wheel does not ship: {missing}"
    bpf = [s for s in sources if s.name.endswith((".bpf.c", ".h"))]
    assert any(s.parts[:3] == ("otel_ebpf", "bpf", "include") for s in bpf) and len(bpf) >= 15, bpf
    # the application tracepoints' USDT site, compiled by setup.py (scripts/setup.sh installs sys/sdt.h)
    assert any(n.startswith("otel_ebpf/tracepoints/_oetp.") and n.endswith(".so") for n in names), sorted(names)
    # the OTLP span encoders (otel_ebpf/emit/_otlpenc*.c; the exporters fall back to Python without them)
    assert any(n.startswith("otel_ebpf/emit/_otlpenc.") and n.endswith(".so") for n in names), sorted(names)
    # the OTLP trace request decoder (otel_ebpf/emit/_otlpdec.c; the gateway converts in Python without it)
    assert any(n.startswith("otel_ebpf/emit/_otlpdec.") and n.endswith(".so") for n in names), sorted(names)
    # the C ring buffer reader (otel_ebpf/bpf/_ringread.c; the receivers fall back to BCC's callbacks without it)
    assert any(n.startswith("otel_ebpf/bpf/_ringread.") and n.endswith(".so") for n in names), sorted(names)
    # the record decoder, the frozen-record maker and the collective join's intake (each has a Python path too)
    for ext in ("bpf/_recdec", "core/_frozen", "processors/collective_join/_intake"):
        assert any(n.startswith(f"otel_ebpf/{ext}.") and n.endswith(".so") for n in names), (ext, sorted(names))
    # the NCCL profiler plugin, under the file name NCCL resolves (docs/nccl-profiler.md)
    assert "otel_ebpf/nccl_profiler/libnccl-profiler-otel_ebpf.so" in names, sorted(names)
    tops = {n.split("/")[0] for n in names} - {"otel_ebpf"}  # nothing generic at the top of site-packages
    assert len(tops) == 1 and tops.pop().endswith(".dist-info"), sorted(names)
    assert set(PACKAGE_DIRS.values()) <= {n.rsplit("/", 1)[0] for n in names}


def test_installed_package_is_the_wheel_not_the_checkout(installed: Path, elsewhere: Path) -> None:
    code = ("import otel_ebpf, otel_ebpf.emit.emitter, otel_ebpf.receivers.cuda, otel_ebpf.processors.cuda;"
            "from otel_ebpf.emit import otlp_native, otlp_in, _otlpenc; from otel_ebpf.bpf import ringread, _ringread;"
            "print(otel_ebpf.__file__); print(otel_ebpf.receivers.cuda.__file__); print(_otlpenc.__file__);"
            "print(_ringread.__file__); assert otlp_native.NATIVE and ringread.NATIVE and otlp_in.NATIVE")
    r = run([str(installed / "python"), "-c", code], cwd=elsewhere, timeout=60)
    site = installed.parent / "lib"
    assert all(Path(line).is_relative_to(site) for line in r.stdout.split()), r.stdout


def test_config_defaults_from_the_wheel(installed: Path, elsewhere: Path) -> None:
    r = run([str(installed / "otel-ebpf"), "config", "--defaults"], cwd=elsewhere, timeout=60)
    data = yaml.safe_load(r.stdout)
    assert set(data) == {"receivers", "processors", "exporters", "service"}
    assert {"cuda", "nccl", "nvml"} <= set(data["receivers"])
    # every component the checkout registers is in the wheel, with the same documented defaults
    checkout = subprocess.run([sys.executable, "-m", "otel_ebpf", "config", "--defaults"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
    assert checkout.returncode == 0 and r.stdout == checkout.stdout


def test_check_from_the_wheel(installed: Path, elsewhere: Path, bpf_ready: None) -> None:
    r = run([str(installed / "otel-ebpf"), "check"], cwd=elsewhere, timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "eBPF tracing can run on this host" in r.stdout


def test_dump_bpf_from_the_wheel(installed: Path, elsewhere: Path) -> None:
    r = run([str(installed / "otel-ebpf"), "run", "--dump-bpf", "--", "true"], cwd=elsewhere, timeout=60)
    receivers = [line.split()[-1] for line in r.stdout.splitlines() if line.startswith("// ===== receiver ")]
    assert {"cuda", "nccl"} <= set(receivers), receivers
    assert r.stdout.count("// ---- common.bpf.c") == len(receivers)
    files = [Path(line.split('"')[1]) for line in r.stdout.splitlines() if line.startswith("#line 1 ")]
    # one program file per receiver, plus the nccl receiver's NCCL profiler plugin handlers (nccl_prof.bpf.c)
    assert sorted(f.name for f in files) == sorted([f"{r}.bpf.c" for r in receivers] + ["nccl_prof.bpf.c"]), files
    assert all(f.is_file() and f.is_relative_to(installed.parent) for f in files), files


def test_run_compiles_every_default_program_from_the_wheel(installed: Path, elsewhere: Path, bpf_ready: None) -> None:
    """BCC compiles the installed .bpf.c files with their installed headers, then the command runs (every
    program before it: with a deferred start, `true` would end before cuda and nccl had compiled)."""
    config = elsewhere / "all-first.yaml"
    config.write_text("service:\n  deferred_start: false\n")
    config.chmod(0o600)
    r = run([str(installed / "otel-ebpf"), "run", "--config", str(config), "--output", "out", "--", "true"],
            cwd=elsewhere, timeout=180, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "probes attached (0 failed)" in r.stderr, r.stderr[-2000:]
    assert (elsewhere / "out" / "metrics.jsonl").stat().st_size > 0
    # the default, deferred start: the library gate (bpf/gate.bpf.c) compiles from the wheel too
    r = run([str(installed / "otel-ebpf"), "run", "--log-level", "info", "--output", "out2", "--", "true"],
            cwd=elsewhere, timeout=180, check=False)
    assert r.returncode == 0 and "receiver gate started" in r.stderr, r.stderr[-4000:]
