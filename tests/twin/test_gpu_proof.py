"""The GPU proof kit's dry run (scripts/gpu-proof.sh run --twin --quick, docs/gpu-proof.md): every step the kit runs
on a GPU machine runs here on the twin, through the same script, driver and comparisons, so the kit cannot rot
between GPU loans. What the twin cannot give (CUPTI, nvidia-smi, Triton) is replaced as results.md says; the
steps must still pass. Needs root, BCC and .venv-twin (runs in CI)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(480)]
ROOT = Path(__file__).resolve().parents[2]


def test_dry_run_passes_every_step_on_the_twin(bpf_ready: None, twin: TwinEnv, tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "GPU_PROOF_BUDGET": "360"}
    r = subprocess.run([str(ROOT / "scripts" / "gpu-proof.sh"), "run", "--twin", "--quick"], env=env,
                       capture_output=True, text=True, timeout=450)
    assert (tmp_path / "results.json").exists(), (r.stdout + r.stderr)[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    failed = {n: {k: v for k, v in s.items() if k in ("status", "rows", "stderr", "traceback", "agent_stderr")}
              for n, s in results["steps"].items() if s["status"] != "pass"}
    assert not failed, json.dumps(failed, indent=1)[-6000:]
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert list(results["steps"]) == ["check", "nvml", "training", "ddp", "probe_cost", "overhead"]
    train = results["steps"]["training"]
    assert train["ours"]["runtime"] > 50 and train["ours"]["graph"] > 0, train["ours"]
    ddp = results["steps"]["ddp"]
    assert len(ddp["comms"]) == 1 and ddp["ops"].get("AllReduce", 0) >= 3, ddp["ops"]
    assert results["steps"]["probe_cost"]["ratio"] > 0
    md = (tmp_path / "results.md").read_text()
    assert "| training | kernel launches, runtime API |" in md and "overall: **pass**" in md
    assert "| training | memory copies, runtime API (cudaMemcpy*) |" in md
    assert (tmp_path / "log.txt").exists()
    print(md)
