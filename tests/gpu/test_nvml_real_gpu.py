"""The nvml receiver's scrape on a REAL NVIDIA GPU and driver (skips without one, saying why).

It runs in a fresh interpreter with no LD_LIBRARY_PATH / STAND_IN_NVML_SCENARIO, so the
stand-in libnvidia-ml.so.1 that unit tests map into the pytest process cannot answer for the GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = """
import json, sys
from otel_ebpf.host.nvml import load
nv, why = load()
if nv is None:
    print(json.dumps({"error": why})); sys.exit(0)
from otel_ebpf.receivers.nvml.scrape import Scraper
from otel_ebpf.core.telemetry import Telemetry
t = Telemetry()
s = Scraper(nv, t, want_pid=lambda pid: True)
s.scrape()
records = s.scrape()  # the second scrape has PCIe/NVLink rates and warm caches
print(json.dumps({"driver": nv.nvmlSystemGetDriverVersion(), "durations": s.durations,
                  "errors": [[a, v] for n, a, v in t.snapshot()],
                  "records": [[r.pid, r.name, r.kind, r.value, dict(r.attributes)] for r in records]}))
nv.nvmlShutdown()
"""


@pytest.fixture(scope="module")
def scrape() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD", "STAND_IN_NVML_SCENARIO")}
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if "error" in out:
        pytest.skip(f"needs a real NVIDIA GPU (NVML: {out['error']})")
    return out


def values(out: dict[str, Any], name: str, **attrs: Any) -> list[float]:
    return [v for pid, n, _, v, a in out["records"] if n == name and pid is None
            and all(a.get(k) == x for k, x in attrs.items())]


def test_real_gpu_values_are_sane(scrape: dict[str, Any]) -> None:
    gpus = {a["hw.id"] for pid, n, _, _, a in scrape["records"] if n == "hw.status"}
    assert gpus and all(g.startswith("GPU-") for g in gpus), gpus
    for gpu in gpus:
        limit, used = values(scrape, "hw.gpu.memory.limit", **{"hw.id": gpu}), values(
            scrape, "hw.gpu.memory.usage", **{"hw.id": gpu})
        assert limit and limit[0] > 1 << 30 and 0 <= used[0] <= limit[0]
        assert all(0 <= v <= 1 for v in values(scrape, "hw.gpu.utilization", **{"hw.id": gpu}))
        assert all(0 < v < 120 for v in values(scrape, "hw.temperature", **{"hw.id": gpu}))
        assert all(0 < v < 2000 for v in values(scrape, "hw.power", **{"hw.id": gpu}))
        assert all(v > 1e8 for v in values(scrape, "nvidia.gpu.clock.speed", **{"hw.id": gpu}))
        assert values(scrape, "hw.status", **{"hw.id": gpu, "hw.state": "ok"}) in ([1], [])
        assert scrape["durations"][gpu] < 1.0  # one GPU's scrape, seconds
    attrs = next(a for pid, n, _, _, a in scrape["records"] if n == "hw.temperature")
    assert attrs["hw.vendor"] == "NVIDIA" and attrs["hw.driver_version"] == scrape["driver"]
    assert attrs["pci.bus_id"].count(":") == 2 and attrs["hw.name"] == f"nvidia{attrs['gpu.index']}"
