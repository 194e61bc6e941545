"""The declared dependency floors are true: every runtime dependency at exactly its ``>=`` floor
from pyproject.toml (``name==floor``, one pip resolve with the wheel; what they pull in
themselves is pip's choice), in a fresh venv outside the checkout, then:

* every module of the installed package imports (``__main__`` aside: it runs the CLI);
* ``otel-ebpf config --defaults`` runs;
* the unit tests of the emit stage, the OTLP receiver and config run against the installed wheel
  (a copy of tests/ outside the checkout, so ``otel_ebpf`` is the wheel's, not the checkout's).

The venv has ``--system-site-packages`` (as deployments have, for BCC), so a floor that the
distribution already satisfies (Debian 12's PyYAML 6.0) is used as it is. Binary wheels only: a
floor that would need a compiler to install is not a floor a user gets.
"""
from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest

from tests.support.wheel import ROOT, fresh_venv, run

#: the unit tests that run against the floors: the emit stage (SDK spans and metrics, sending
#: queues, OTLP JSON, Prometheus), OTLP in (SDK exporters against the receiver, refusals), config
UNIT_TESTS = ["emit/test_emitter.py", "emit/test_sending.py", "emit/test_jsonfile.py", "emit/test_histograms.py",
              "emit/test_otlp_json.py",  # our OTLP/JSON encoder writes what the SDK + json_format write, there too
              "emit/test_otlp_in.py", "receivers/test_otlp_server.py", "receivers/test_otlp_server_refusal.py",
              "emit/test_prometheus_exporter.py", "gateway/test_gateway_losses.py", "host/test_resources.py",
              "core/test_ids.py", "core/test_config.py", "service/test_settings.py"]
TEST_REQUIREMENTS = ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6"]
_IMPORT_ALL = """
import importlib, pkgutil, otel_ebpf
# otel_ebpf.demo.train is the demo's torch job: package data run by the twin's venv (torch 2.11), not the agent's;
# a name that is no identifier (libnccl-profiler-otel_ebpf.so, the NCCL profiler plugin) is a C library, no module
names = [m.name for m in pkgutil.walk_packages(otel_ebpf.__path__, "otel_ebpf.")
         if not m.name.endswith("__main__") and m.name != "otel_ebpf.demo.train"
         and m.name.rsplit(".", 1)[-1].isidentifier()]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def floors() -> dict[str, str]:
    """pyproject.toml's runtime dependencies: name -> floor. Each must be declared ``name>=floor``."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][A-Za-z0-9.]*)", dep.replace(" ", ""))
        assert m, f"runtime dependency without a plain '>=' floor: {dep!r}"
        out[m[1]] = m[2]
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def floor_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and every runtime dependency at its floor. Returns its bin folder."""
    bin_dir = fresh_venv(tmp_path_factory.mktemp("floors") / "venv")
    pins = [f"{name}=={floor}" for name, floor in floors().items()]
    run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--only-binary", ":all:", str(wheel), *pins,
         *TEST_REQUIREMENTS], cwd=wheel.parent, timeout=600)
    return bin_dir


def test_floor_versions_are_what_is_installed(floor_venv: Path) -> None:
    code = ("import importlib.metadata as m, sys\n"
            "for n in sys.argv[1:]: print(n, m.version(n))")
    r = run([str(floor_venv / "python"), "-c", code, *floors()], cwd=floor_venv, timeout=60)
    got = {_norm(n): v for n, v in (line.split() for line in r.stdout.splitlines())}
    want = {_norm(n): v for n, v in floors().items()}
    # a floor like "6" is met by 6.0 (Debian's PyYAML): compare release tuples, padded
    def key(v: str) -> tuple[int, ...]:
        parts = [int(p) for p in re.findall(r"\d+", v.split("b")[0])]
        return tuple(parts + [0] * (4 - len(parts)))
    assert {n: key(v) for n, v in got.items()} == {n: key(v) for n, v in want.items()}, (got, want)


def test_every_module_imports_at_the_floors(floor_venv: Path, tmp_path: Path) -> None:
    r = run([str(floor_venv / "python"), "-c", _IMPORT_ALL], cwd=tmp_path, timeout=120)
    assert int(r.stdout) > 100, r.stdout
    r = run([str(floor_venv / "otel-ebpf"), "config", "--defaults"], cwd=tmp_path, timeout=60)
    assert "receivers:" in r.stdout


def test_emit_otlp_and_config_unit_tests_pass_at_the_floors(floor_venv: Path, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "tests", tmp_path / "tests",
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.so"))
    shutil.copy2(ROOT / "pyproject.toml", tmp_path)  # pytest's settings (timeout, markers, filterwarnings)
    r = run([str(floor_venv / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
             *(f"tests/unit/{t}" for t in UNIT_TESTS)], cwd=tmp_path, timeout=280, check=False)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
