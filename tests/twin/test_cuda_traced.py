"""The cuda receiver on real PyTorch (torch 2.11, CUDA 13) on the twin: every kernel launch torch makes is
counted, whichever entry point it used (issue 15: torch's own kernels go through ``__cudaLaunchKernel``, which
CUDA 13.0's libcudart turns into ``cudaLaunchKernel``; the twin's stand-in does the same). The stand-in counts
the launches, memsets, event records and stream waits it received; the agent's ``gpu.cuda.kernel.launch.calls``
and ``gpu.cuda.api.calls`` must say the same. Needs root and BCC."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_ebpf.twin import TwinEnv
from tests.faults.agentproc import counter_total
from tests.support.otlp_sink import decode_attrs, metrics_from_jsonl
from tests.twin.conftest import PROGRAMS
from tests.twin.support import traced_run

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(400)]


def test_every_kernel_torch_launches_is_counted(bpf_ready: None, twin: TwinEnv, libdir: Path, tmp_path: Path) -> None:
    stats, agent_out = tmp_path / "stats", tmp_path / "agent"
    stats.mkdir()
    run = traced_run(twin, libdir, PROGRAMS / "launches.py", 1, tmp_path, agent_out,
                     {"OTEL_EBPF_TWIN_STATS": str(stats)})
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert (tmp_path / "done").exists()
    counted: dict[str, int] = {}
    for f in stats.glob("cudart-*.txt"):
        for line in f.read_text().splitlines():
            key, value = line.split()
            counted[key] = counted.get(key, 0) + int(value)
    launched = counted["kernel_launches"]
    assert launched >= 25  # fill, 10 x (mul, add), sum, zeros, copy, 3 x mul: at least one kernel each
    metrics = metrics_from_jsonl(agent_out / "metrics.jsonl")
    assert counter_total(metrics, "gpu.cuda.kernel.launch.calls") == launched
    # every launch named: torch 2.11's <<<>>> passes a cudaKernel_t (the twin's, like CUDA 13's, is no code
    # address), named through the __cudaGetKernel record of its host function and libtorch_cuda.so's symbol table
    names = _kernel_names(metrics)
    assert sum(names.values()) == launched and "" not in names, names
    assert names.get("at::native::vectorized_elementwise_kernel", 0) >= 21, names  # fill, 10 x (mul, add)
    assert names.get("at::native::reduce_kernel", 0) >= 1, names  # sum
    print(f"launches by cuda.kernel.name: {names}")

    def calls(*apis: str) -> int:
        return sum(counter_total(metrics, "gpu.cuda.api.calls", **{"cuda.api": a})
                   for base in apis for a in (base, base + "_ptsz", base + "_ptds"))

    # 3 x (record, wait) and 3 x wait_stream (a record and a wait each), plus what torch does on its own
    assert counted["event_records"] >= 6 and counted["stream_waits"] >= 6, counted
    assert calls("cudaEventRecord", "cudaEventRecordWithFlags") == counted["event_records"], counted
    assert calls("cudaStreamWaitEvent") == counted["stream_waits"], counted
    assert calls("cudaMemset", "cudaMemsetAsync") == counted["memsets"], counted
    # copies (z.copy_(x), y.item()): each counted once, as the runtime call the stand-in received
    assert counted["copies"] >= 2 and _copies(metrics) == counted["copies"], (_copies(metrics), counted)
    print(f"torch 2.11 on the twin: the stand-in received {counted}; the agent counted the same")
    # every probe a receiver needs attached to the stand-ins: the WARNING "attached N of M probes to X; K needed could
    # not attach" is absent (a LOCK-prefixed first instruction cannot be probed: it was, for cudaLaunchKernelExC)
    failed = [line for line in run.stderr.splitlines() if "needed could not attach" in line]
    assert not failed, failed


def _kernel_names(metrics: list) -> dict[str, int]:
    """{cuda.kernel.name ("" when absent): launches}, from the last cumulative value of each series."""
    last: dict[tuple, int] = {}
    for _, m in metrics:
        if m.name == "gpu.cuda.kernel.launch.calls":
            for dp in m.sum.data_points:
                attrs = decode_attrs(dp.attributes)
                last[tuple(sorted(attrs.items()))] = dp.as_int
    names: dict[str, int] = {}
    for key, value in last.items():
        name = str(dict(key).get("cuda.kernel.name", ""))
        names[name] = names.get(name, 0) + value
    return names


def _copies(metrics: list) -> int:
    """Calls counted in gpu.cuda.memory.copy.duration (a cumulative histogram: its last count per series)."""
    last: dict[tuple, int] = {}
    for resource, m in metrics:
        if m.name == "gpu.cuda.memory.copy.duration":
            for dp in m.histogram.data_points:
                key = (tuple(sorted(map(str, resource.items()))), tuple(sorted(decode_attrs(dp.attributes).items())))
                last[key] = max(last.get(key, 0), dp.count)
    return sum(last.values())
