"""The GPU proof's driver: ``otel-ebpf`` against real CUDA, NCCL, NVML and PyTorch on a GPU machine, in one go,
or the same steps against the twin (a dry run, in CI). Run by scripts/gpu-proof.sh with the agent's python:

    python bench/gpu_proof/proof.py --target gpu|twin [--out DIR] [--budget S] [--quick] [--only STEP,...]

Steps (steps.py): check, nvml, training, ddp, probe_cost, overhead, in that order, each bounded by its share of
``--budget`` (a step that ends early leaves its time to the next). ``results.json`` and ``results.md`` are
rewritten in ``--out`` after every step, so a run stopped at the device's limit still leaves what it measured.
Exit 0 when every step passed (a skip is not a pass on ``--target gpu``), 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))

import steps
from common import ROOT, Target

# (name, function, cap in s, least kept back for it while earlier steps run)
STEPS = [("check", steps.check, 60, 15), ("nvml", steps.nvml, 60, 15), ("training", steps.training, 240, 90),
         ("ddp", steps.ddp, 180, 60), ("probe_cost", steps.probe_cost, 120, 40), ("overhead", steps.overhead, 240, 40)]


def gpu_target(workload_python: str | None) -> Target:
    py = workload_python or shutil.which("python3") or "python3"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return Target("gpu", sys.executable, py, env, "inductor", nvml_env=env)


def twin_target(tmp: Path, quick: bool) -> Target:
    from otel_ebpf.twin import build, find_env
    from otel_ebpf.twin.launch import twin_environment
    from tests.support.build import build_stand_in_nvml

    env = find_env()
    libdir = build(env)
    rendezvous = tmp / "twin-rendezvous"
    rendezvous.mkdir()
    wenv = twin_environment(libdir, 1, rendezvous)
    nvml = build_stand_in_nvml()
    nenv = {**os.environ, "LD_LIBRARY_PATH": str(nvml.parent)}
    nenv.pop("STAND_IN_NVML_SCENARIO", None)
    return Target("twin", sys.executable, str(env.python), wenv, "aot_eager", nvml_env=nenv, quick=quick,
                  notes=["twin: real torch 2.11 on stand-in libcudart/libnccl (kernels do nothing, host timing);",
                         "NVML is the stand-in libnvidia-ml and the reference pynvml, not nvidia-smi;",
                         "no CUPTI: launch counts are checked against the stand-in's own count;",
                         "torch.compile runs with backend aot_eager (no Triton), so no driver-API launches."])


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("otel-ebpf", "opentelemetry-sdk", "grpcio", "protobuf", "nvidia-ml-py", "py-spy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "missing"
    try:
        import bcc

        out["bcc"] = str(Path(bcc.__file__).parent)
    except ImportError as exc:
        out["bcc"] = f"missing: {exc}"
    return out


def environment(t: Target) -> dict[str, Any]:
    return {"versions": _versions(),
            "target": t.name, "host": platform.node(), "kernel": platform.release(), "agent_python": t.agent_python,
            "agent_python_version": platform.python_version(), "workload_python": t.workload_python,
            "bcc_kernel_source": os.environ.get("BCC_KERNEL_SOURCE", ""), "notes": t.notes,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def markdown(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [f"# otel-ebpf GPU proof ({env['target']})", "",
             f"{env['started']}, host {env['host']}, kernel {env['kernel']}, agent Python "
             f"{env['agent_python_version']}, {results.get('device', '')}", ""]
    lines += [f"> {n}" for n in env["notes"]]
    lines += ["", "agent side: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
              + (f"; BCC_KERNEL_SOURCE={env['bcc_kernel_source']}" if env["bcc_kernel_source"] else "")]
    lines += ["", "| step | figure | otel-ebpf | reference | verdict |", "|---|---|---|---|---|"]
    for name, r in results["steps"].items():
        for row in r.get("rows", []):
            lines.append("| " + " | ".join([name, *(str(c).replace("|", "/") for c in row)]) + " |")
        lines.append(f"| {name} | **step** | {r['status']} | {r.get('seconds', 0):.1f} s | |")
    lines += ["", f"overall: **{results['status']}** in {results.get('seconds', 0):.0f} s", ""]
    return "\n".join(lines)


def write(out: Path, results: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "results.md").write_text(markdown(results))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-proof")
    ap.add_argument("--target", choices=["gpu", "twin"], default="gpu")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "gpu-proof-out"))
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for all steps together")
    ap.add_argument("--quick", action="store_true", help="fewer steps and rounds (the CI dry run)")
    ap.add_argument("--only", default="", help="comma-separated step names")
    ap.add_argument("--workload-python", default=None, help="gpu: the python that has torch (default python3)")
    a = ap.parse_args(argv)
    start = time.monotonic()
    deadline = start + a.budget
    a.out.mkdir(parents=True, exist_ok=True)
    chosen = [s for s in STEPS if not a.only or s[0] in a.only.split(",")]
    with tempfile.TemporaryDirectory(prefix="gpu-proof-") as tmpdir:
        tmp = Path(tmpdir)
        t = twin_target(tmp, a.quick) if a.target == "twin" else gpu_target(a.workload_python)
        results: dict[str, Any] = {"environment": environment(t), "steps": {}, "status": "running"}
        for i, (name, fn, cap, _) in enumerate(chosen):
            kept_back = sum(s[3] for s in chosen[i + 1:])
            budget = min(cap, deadline - time.monotonic() - kept_back)
            t0 = time.monotonic()
            print(f"gpu-proof: {name} (budget {budget:.0f} s)", file=sys.stderr, flush=True)
            if budget < 10:
                r: dict[str, Any] = {"status": "skip", "why": "out of time", "rows": []}
            else:
                step_tmp = tmp / name
                step_tmp.mkdir()
                try:
                    r = fn(t, step_tmp, budget)
                except Exception:
                    r = {"status": "error", "traceback": traceback.format_exc(),
                         "rows": [[name, "raised", "", "ERROR"]]}
            r["seconds"] = time.monotonic() - t0
            results["steps"][name] = r
            if name == "training" and r.get("workload"):
                results["device"] = r["workload"].get("device", "")
            results["seconds"] = time.monotonic() - start
            write(a.out, results)
            print(f"gpu-proof: {name}: {r['status']} in {r['seconds']:.1f} s", file=sys.stderr, flush=True)
    ok = all(r["status"] == "pass" for r in results["steps"].values())
    results["status"] = "pass" if ok else "fail"
    results["seconds"] = time.monotonic() - start
    write(a.out, results)
    print(markdown(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
