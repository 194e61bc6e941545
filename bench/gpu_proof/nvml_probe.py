"""GPU proof, step 2: the nvml receiver's scrape and ``nvidia-smi --query-gpu`` taken in the same second.

Run by the agent's python (it imports otel_ebpf). Prints one JSON line: the scraper's device-level records
(name, value, attributes), the reference rows, and when each was read. The reference is ``nvidia-smi`` when it
is on PATH; without it (the twin) the same fields are read straight through pynvml (``--smi pynvml``), which
checks this step's plumbing and the comparison, not NVIDIA's tool: the results say which one it was.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from typing import Any

FIELDS = ["index", "uuid", "pci.bus_id", "driver_version", "name", "memory.total", "memory.used",
          "temperature.gpu", "power.draw", "utilization.gpu", "clocks.sm", "clocks.mem"]


def _pynvml_rows(nv: Any) -> list[dict[str, str]]:
    rows = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        mem = nv.nvmlDeviceGetMemoryInfo(h)

        def s(v: Any) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        rows.append({"index": str(i), "uuid": s(nv.nvmlDeviceGetUUID(h)),
                     "pci.bus_id": s(nv.nvmlDeviceGetPciInfo(h).busId),
                     "driver_version": s(nv.nvmlSystemGetDriverVersion()), "name": s(nv.nvmlDeviceGetName(h)),
                     "memory.total": str(mem.total // 2**20), "memory.used": str(mem.used // 2**20),
                     "temperature.gpu": str(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                     "power.draw": f"{nv.nvmlDeviceGetPowerUsage(h) / 1000:.2f}",
                     "utilization.gpu": str(nv.nvmlDeviceGetUtilizationRates(h).gpu),
                     "clocks.sm": str(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                     "clocks.mem": str(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))})
    return rows


def _smi_rows() -> list[dict[str, str]]:
    r = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True, timeout=20, check=True)
    return [dict(zip(FIELDS, (c.strip() for c in line.split(",")), strict=True))
            for line in r.stdout.splitlines() if line.strip()]


def main() -> int:
    from otel_ebpf.core.telemetry import Telemetry
    from otel_ebpf.host.nvml import load
    from otel_ebpf.receivers.nvml.scrape import Scraper

    use_pynvml = "--smi" in sys.argv and sys.argv[sys.argv.index("--smi") + 1] == "pynvml"
    nv, why = load()
    if nv is None:
        print(json.dumps({"error": f"NVML: {why}"}))
        return 0
    s = Scraper(nv, Telemetry(), want_pid=lambda pid: True)
    first = s.scrape()
    time.sleep(0.2)  # rates need two scrapes
    t_scrape = time.time()
    second = s.scrape()
    # up-down counters (memory) are emitted as changes since the last scrape: the value is their sum
    latest: dict[tuple[str, str], list[Any]] = {}
    for r in (*first, *second):
        if r.pid is not None:
            continue
        key = (r.name, json.dumps(dict(r.attributes), sort_keys=True, default=str))
        if r.kind == "updown" and key in latest:
            latest[key][1] += r.value
        else:
            latest[key] = [r.name, r.value, dict(r.attributes)]
    reference = "pynvml" if use_pynvml or shutil.which("nvidia-smi") is None else "nvidia-smi"
    rows = _pynvml_rows(nv) if reference == "pynvml" else _smi_rows()
    t_ref = time.time()
    print(json.dumps({"reference": reference, "t_scrape": t_scrape, "t_reference": t_ref, "rows": rows,
                      "records": list(latest.values())}, default=str))
    nv.nvmlShutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
