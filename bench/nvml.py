"""NVML scrape cost per GPU per interval: ``.venv/bin/python bench/nvml.py [--gpus 8] [--scrapes 200]``.

Runs the nvml receiver's Scraper through the REAL pynvml bindings against the STAND-IN
libnvidia-ml.so.1 (tests/support/stand_in_nvml.c), whose calls return at once. So it measures
otel-ebpf's own cost (Python, pynvml/ctypes, record building) per GPU per scrape, NOT a
driver's: on real hardware each NVML call also enters the kernel driver, and
nvmlDeviceGetPcieThroughput samples PCIe for ~20 ms (the scraper uses the byte-counter fields
instead where the driver has them). Measure on a GPU host with tests/gpu for those.

Also measured: the no-NVML path (a fresh interpreter, no libnvidia-ml.so.1): how long the
receiver takes to find out and disable itself. Prints a Markdown table; every figure comes from
this run.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_NO_NVML = """
import time; t0 = time.perf_counter()
from otel_ebpf.receivers import nvml; from otel_ebpf.core.pipeline import Context, ListConsumer
r = nvml.factory.create(nvml.Config(), Context(), ListConsumer()); r.start(); r.ready.wait(30); r.shutdown()
print(time.perf_counter() - t0, r.disabled is not None)
"""


def scenario(gpus: int, procs: int, links: int) -> str:
    lines = [f"count {gpus}"]
    for g in range(gpus):
        lines += [f"gpu {g}", f"nvlink_links {links}", f"nvlink_up_mask {(1 << links) - 1}", "pcie_tx_bytes 1",
                  "pcie_rx_bytes 2"]
        lines += [f"proc {100000 + g * procs + p} 1073741824\nputil {100000 + g * procs + p} 50 10 0 0"
                  for p in range(procs)]
    return "\n".join(lines) + "\n"


def measure(gpus: int, procs: int, links: int, scrapes: int) -> dict[str, float]:
    from otel_ebpf.host.nvml import load
    from otel_ebpf.receivers.nvml.scrape import Scraper
    from otel_ebpf.core.telemetry import Telemetry

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as fh:
        fh.write(scenario(gpus, procs, links))
    os.environ["STAND_IN_NVML_SCENARIO"] = fh.name
    nv, why = load()
    if nv is None:
        sys.exit(f"bench: NVML stand-in did not load: {why}")
    try:
        scraper = Scraper(nv, Telemetry(), want_pid=lambda pid: True)
        scraper.scrape()  # discovery and first-reading deltas out of the way
        per_gpu: list[float] = []
        cpu: list[float] = []
        records = 0
        for _ in range(scrapes):
            c0 = time.process_time()
            records = len(scraper.scrape())
            cpu.append(time.process_time() - c0)
            per_gpu.extend(scraper.durations.values())
    finally:
        nv.nvmlShutdown()
        os.unlink(fh.name)
    per_gpu.sort()
    return {"median_us": statistics.median(per_gpu) * 1e6, "p95_us": per_gpu[int(len(per_gpu) * 0.95)] * 1e6,
            "cpu_per_scrape_ms": statistics.mean(cpu) * 1e3, "records": records}


def no_nvml_cost() -> tuple[float, bool]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "STAND_IN_NVML_SCENARIO")}
    r = subprocess.run([sys.executable, "-c", _NO_NVML], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=120, check=True)
    took, disabled = r.stdout.split()
    return float(took), disabled == "True"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--procs", type=int, default=4, help="processes per GPU")
    p.add_argument("--links", type=int, default=18, help="NVLink links per GPU (18: H100/H200 SXM)")
    p.add_argument("--scrapes", type=int, default=200)
    args = p.parse_args(argv)
    from tests.support.build import build_stand_in_nvml

    ctypes.CDLL(str(build_stand_in_nvml()), mode=ctypes.RTLD_GLOBAL)  # pynvml binds to it by soname
    print("NVML scrape cost with the STAND-IN libnvidia-ml.so.1: otel-ebpf's own cost only, "
          "not a driver's (real NVML calls enter the kernel driver; see the module docstring).\n")
    print("| GPUs | procs/GPU | NVLinks | per-GPU scrape median | p95 | CPU per scrape (all GPUs) "
          "| records/scrape (steady) |")
    print("|---|---|---|---|---|---|---|")
    for gpus, procs, links in ((1, 0, 0), (args.gpus, 0, 0), (args.gpus, args.procs, args.links)):
        r = measure(gpus, procs, links, args.scrapes)
        print(f"| {gpus} | {procs} | {links} | {r['median_us']:.0f} µs | {r['p95_us']:.0f} µs | "
              f"{r['cpu_per_scrape_ms']:.2f} ms | {r['records']:.0f} |")
    took, disabled = no_nvml_cost()
    print(f"\nNo NVML on the host: receiver disabled={disabled} after {took * 1e3:.0f} ms "
          "(fresh interpreter, including its imports).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
