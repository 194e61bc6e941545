"""The GPU proof's five steps. Each takes a :class:`Target`, a scratch folder and a time budget (s), and returns
a dict: ``status`` (pass | fail | skip | error), ``rows`` (figure, ours, reference, verdict) for the Markdown table,
and the details. A step never raises for what it measures; the driver (proof.py) catches the rest."""
from __future__ import annotations

import json
import socket
import statistics
import time
from pathlib import Path
from typing import Any

from common import HERE, Target, agent_config, agent_run, launch_window, run_bounded

__all__ = ["check", "ddp", "nvml", "overhead", "probe_cost", "training"]

Row = list[str]
RUNTIME = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel")
DRIVER = ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel")
# copies as the agent probes them (receivers/cuda/apis.py); names as the profiler's keys reduce them (up to "_")
RUNTIME_COPIES = ("cudaMemcpy", "cudaMemcpyAsync")
DRIVER_COPIES = ("cuMemcpy", "cuMemcpyAsync", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyDtoD", "cuMemcpyHtoDAsync",
                 "cuMemcpyDtoHAsync", "cuMemcpyDtoDAsync")


def _tail(text: str, n: int = 2500) -> str:
    return text[-n:]


def check(t: Target, tmp: Path, budget: float) -> dict[str, Any]:
    """1. ``otel-ebpf check``: exit 0 means eBPF, headers and the probes' needs are there."""
    d = run_bounded([t.agent_python, "-m", "otel_ebpf", "check"], min(budget, 120))
    lines = [ln for ln in (d.out + d.err).splitlines() if ln.strip()]
    return {"status": "pass" if d.rc == 0 else "fail", "rc": d.rc, "output": lines, "seconds": d.seconds,
            "rows": [["otel-ebpf check", f"exit {d.rc}", "exit 0", "ok" if d.rc == 0 else "FAIL"]]}


# NVML: (nvidia-smi field, receiver metric, scale from the metric to the field's unit, tolerance)
_NVML = [("memory.total", "hw.gpu.memory.limit", 2**-20, 1.0), ("memory.used", "hw.gpu.memory.usage", 2**-20, 64.0),
         ("temperature.gpu", "hw.temperature", 1.0, 2.0), ("power.draw", "hw.power", 1.0, 25.0),
         ("utilization.gpu", "hw.gpu.utilization", 100.0, 25.0), ("clocks.sm", "nvidia.gpu.clock.speed", 1e-6, 200.0),
         ("clocks.mem", "nvidia.gpu.clock.speed", 1e-6, 1.0)]


def nvml(t: Target, tmp: Path, budget: float) -> dict[str, Any]:
    """2. The nvml receiver's scrape against nvidia-smi (or pynvml on the twin), field by field."""
    args = ["--smi", "pynvml"] if t.name == "twin" else []
    d = run_bounded([t.agent_python, str(HERE / "nvml_probe.py"), *args], min(budget, 60), env=t.nvml_env)
    try:
        got = json.loads(d.out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"status": "error", "rc": d.rc, "stderr": _tail(d.err),
                "rows": [["NVML scrape", "no output", "", "ERROR"]]}
    if "error" in got:
        return {"status": "fail", "error": got["error"], "rows": [["NVML scrape", got["error"], "", "FAIL"]]}
    rows: list[Row] = []
    bad = 0
    for ref in got["rows"]:
        uuid = ref["uuid"]

        def val(metric: str, uuid: str = uuid, **attrs: Any) -> float | None:
            for name, v, a in got["records"]:
                if name == metric and a.get("hw.id") == uuid and all(a.get(k) == x for k, x in attrs.items()):
                    return float(v)
            return None

        attrs = next((a for n, _, a in got["records"] if n == "hw.temperature" and a.get("hw.id") == uuid), {})
        for field_, ours in (("uuid", uuid if attrs else None), ("pci.bus_id", attrs.get("pci.bus_id")),
                             ("driver_version", attrs.get("hw.driver_version"))):
            same = ours is not None and str(ours).lower().endswith(ref[field_].lower()[-12:])
            bad += not same
            rows.append([f"GPU {ref['index']} {field_}", str(ours), ref[field_], "ok" if same else "DIFFERS"])
        for field_, metric, scale, tol in _NVML:
            dom = {"nvidia.gpu.clock.domain": "sm" if field_ == "clocks.sm" else "memory"} if "clocks" in field_ else {}
            v = val(metric, **dom)
            try:
                r = float(ref[field_])
            except ValueError:  # "[N/A]": the driver does not report it
                rows.append([f"GPU {ref['index']} {field_}", "-" if v is None else f"{v * scale:.1f}", ref[field_],
                             "n/a"])
                continue
            ok = v is not None and abs(v * scale - r) <= tol
            bad += not ok
            rows.append([f"GPU {ref['index']} {field_}", "missing" if v is None else f"{v * scale:.1f}", f"{r:g}",
                         "ok" if ok else f"DIFFERS (tolerance {tol:g})"])
    skew = abs(got["t_reference"] - got["t_scrape"])
    rows.append(["NVML: scrape vs reference read", f"{skew * 1e3:.0f} ms apart", "< 1000 ms",
                 "ok" if skew < 1 else "FAIL"])
    return {"status": "pass" if bad == 0 and skew < 1 and got["rows"] else "fail", "reference": got["reference"],
            "rows": rows, "reference_rows": got["rows"]}


def _workload(t: Target, script: str, out: Path, *args: str) -> list[str]:
    return [t.workload_python, str(HERE / script), "--out", str(out), *args]


def training(t: Target, tmp: Path, budget: float) -> dict[str, Any]:
    """3. A training step (MLP, torch.compile, CUDA graph replay) traced with the default pipeline and profiled by
    torch.profiler in the same run: launches in the measured window, runtime vs driver, against the profiler."""
    steps = "5" if t.quick else "20"
    wl, agent_out = tmp / "train.json", tmp / "train-agent"
    cfg = agent_config(tmp / "train.yaml")
    stats = tmp / "twin-stats"
    stats.mkdir(exist_ok=True)
    env = {**t.workload_env, "OTEL_EBPF_TWIN_STATS": str(stats)}
    cmd = _workload(t, "train_step.py", wl, "--steps", steps, "--profile", "--compile-backend", t.compile_backend,
                    *(["--width", "256", "--batch", "32"] if t.name == "twin" else []))
    d = agent_run(t, cfg, agent_out, cmd, min(budget, 300), env=env)
    if d.rc != 0 or not wl.exists():
        return {"status": "error", "rc": d.rc, "timed_out": d.timed_out, "stderr": _tail(d.err),
                "rows": [["training step", f"exit {d.rc}", "exit 0", "ERROR"]]}
    w = json.loads(wl.read_text())
    t0, t1 = w["t0_ns"], w["t1_ns"]

    def window(name: str, apis: tuple[str, ...] | None) -> int | None:
        return launch_window(agent_out, name, t0, t1, lambda a: a.get("cuda.graph.captured") is not True and (
            apis is None or str(a.get("cuda.api", "")).split("_")[0] in apis))

    ours = {"runtime": window("gpu.cuda.kernel.launch.calls", RUNTIME),
            "driver": window("gpu.cuda.kernel.launch.calls", DRIVER),
            "graph": window("gpu.cuda.graph.launch.calls", None)}
    prof = w.get("profiler") or {}
    calls = prof.get("api_calls", {})
    def api(names: tuple[str, ...]) -> int | None:  # "cuda_runtime:cudaLaunchKernel_ptsz" -> cudaLaunchKernel
        return sum(v for k, v in calls.items() if k.split(":")[1].split("_")[0] in names) or None

    ref = {"runtime": api(RUNTIME), "driver": api(DRIVER), "graph": api(("cudaGraphLaunch", "cuGraphLaunch"))}
    source = "torch.profiler (CUPTI)"
    counted = _twin_stats(stats)
    if not prof.get("kernels"):  # the twin: no CUPTI; the stand-in libcudart's own count is the reference
        source = "twin stand-in's own count (no CUPTI here)"
        # its kernel_launches counts captured launches too (cudart_kernels.c count_launch); the agent marks those
        ref = {"runtime": counted.get("kernel_launches", 0) - counted.get("captured_launches", 0), "driver": None,
               "graph": counted.get("graph_launches")}
        ours["runtime"] = _whole_run(agent_out, "gpu.cuda.kernel.launch.calls", RUNTIME)
        ours["graph"] = _whole_run(agent_out, "gpu.cuda.graph.launch.calls", None)
    rows: list[Row] = []
    bad = 0
    for kind in ("runtime", "driver", "graph"):
        o, r = ours[kind], ref[kind]
        ok = (o or 0) == (r or 0)
        bad += not ok
        label = {"runtime": "kernel launches, runtime API", "driver": "kernel launches, driver API (Triton)",
                 "graph": "CUDA graph launches"}[kind]
        rows.append([label, str(o), f"{r} ({source})", "ok" if ok else "DIFFERS"])
    bad += _copy_rows(rows, agent_out, t0, t1, api if prof.get("kernels") else None, counted)
    if prof.get("kernels"):
        by_api = prof.get("kernels_by_api", {})
        eager = sum(v for k, v in by_api.items() if k.split("_")[0] in RUNTIME + DRIVER)
        launched = (ours["runtime"] or 0) + (ours["driver"] or 0)
        bad += launched != eager
        rows.append(["kernels launched (runtime + driver) vs kernels run from those launches (CUPTI)",
                     str(launched), str(eager), "ok" if launched == eager else "DIFFERS"])
        rows.append(["kernels run (profiler), of which by graph replay", "-",
                     f"{prof['kernels']}, {sum(v for k, v in prof['kernels_by_api'].items() if 'Graph' in k)}", "info"])
    return {"status": "pass" if bad == 0 else "fail", "ours": ours, "reference": ref, "reference_source": source,
            "twin_stats": counted,
            "workload": w, "agent_stderr": _tail(d.err, 1500), "rows": rows,
            "step_ms_median": statistics.median(w["step_ms"]) if w["step_ms"] else None}


def _copy_rows(rows: list[Row], agent_out: Path, t0: int, t1: int,
               api: Any, counted: dict[str, int]) -> int:
    """Copies, the runtime's and the driver's apart, against the profiler's API calls (``api``) or, on the twin,
    the stand-in's own count of the whole run: a runtime copy that reaches the driver must be counted once, as
    the runtime call (cuda.bpf.c driver_memcpy_enter); torch makes no driver copy itself. Returns the rows that
    differ."""
    def ours(apis: tuple[str, ...]) -> int | None:
        if api is None:
            return _whole_run(agent_out, "gpu.cuda.memory.copy.duration", apis, field="count", captured_too=True)
        return launch_window(agent_out, "gpu.cuda.memory.copy.duration", t0, t1,
                             lambda a: str(a.get("cuda.api", "")).split("_")[0] in apis, field="count")

    if api is None:
        ref = {"runtime": counted.get("copies"), "driver": 0}
        source = "twin stand-in's own count (no CUPTI here)"
    else:
        ref = {"runtime": api(RUNTIME_COPIES), "driver": api(DRIVER_COPIES)}
        source = "torch.profiler (CUPTI)"
    bad = 0
    for kind, apis in (("runtime", RUNTIME_COPIES), ("driver", DRIVER_COPIES)):
        o, r = ours(apis), ref[kind]
        ok = (o or 0) == (r or 0)
        bad += not ok
        rows.append([f"memory copies, {kind} API ({'cudaMemcpy*' if kind == 'runtime' else 'cuMemcpy*'})",
                     str(o), f"{r} ({source})", "ok" if ok else "DIFFERS"])
    return bad


def _twin_stats(stats: Path) -> dict[str, int]:
    counted: dict[str, int] = {}
    for f in stats.glob("cudart-*.txt"):
        for line in f.read_text().splitlines():
            key, value = line.split()
            counted[key] = counted.get(key, 0) + int(value)
    return counted


def _whole_run(out: Path, name: str, apis: tuple[str, ...] | None, field: str = "value",
               captured_too: bool = False) -> int | None:
    """The counter's last cumulative value (the twin's reference counts the whole process); ``field="count"``: a
    histogram's count; ``captured_too``: calls made during a stream capture included (the twin counts them)."""
    from common import snapshots

    snaps = snapshots(out, name, lambda a: (captured_too or a.get("cuda.graph.captured") is not True) and (
        apis is None or str(a.get("cuda.api", "")).split("_")[0] in apis), field)
    return int(snaps[-1][1]) if snaps else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ddp(t: Target, tmp: Path, budget: float) -> dict[str, Any]:
    """4. One-rank NCCL + DDP traced (NCCL receiver + profiler plugin) and profiled in the same run."""
    from otel_ebpf.report.otlpfiles import read_otlp_json

    wl, agent_out = tmp / "ddp.json", tmp / "ddp-agent"
    cfg = agent_config(tmp / "ddp.yaml")
    env = {**t.workload_env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    cmd = _workload(t, "ddp_step.py", wl, "--steps", "3" if t.quick else "10", "--profile",
                    *(["--width", "256"] if t.name == "twin" else []))
    d = agent_run(t, cfg, agent_out, cmd, min(budget, 240), env=env)
    if d.rc != 0 or not wl.exists():
        return {"status": "error", "rc": d.rc, "timed_out": d.timed_out, "stderr": _tail(d.err),
                "rows": [["DDP step", f"exit {d.rc}", "exit 0", "ERROR"]]}
    w = json.loads(wl.read_text())
    spans = [s for s in read_otlp_json(agent_out).spans if s.get("nccl.op") and w["t0_ns"] <= s.start_ns <= w["t1_ns"]]
    # a collective is a root span ("nccl AllReduce") with its call span as child: one per (comm, seq)
    host: dict[tuple[str, int], Any] = {}
    for s in spans:
        if s.get("nccl.source") != "profiler_plugin" and s.get("nccl.seq") is not None:
            host.setdefault((str(s.get("nccl.comm.id")), int(s.get("nccl.seq"))), s)
    comms = sorted({c for c, _ in host})
    seqs = {c: sorted(q for cc, q in host if cc == c) for c in comms}
    gpu = [int(s.get("nccl.gpu.duration_ns")) for s in spans if s.get("nccl.gpu.duration_ns") is not None]
    ops: dict[str, int] = {}
    for s in host.values():
        ops[str(s.get("nccl.op"))] = ops.get(str(s.get("nccl.op")), 0) + 1
    issued = w["issued"]
    kern = w.get("profiler_nccl_kernels") or []
    contiguous = bool(seqs) and all(v == list(range(v[0], v[0] + len(v))) for v in seqs.values())
    rows = [["NCCL collectives seen (host spans, window)", json.dumps(ops),
             f">= {issued['allreduce_explicit']} AllReduce + {issued['broadcast_explicit']} Broadcast + "
             f"{issued['alltoall_explicit']} all_to_all issued",
             "ok" if ops.get("AllReduce", 0) >= issued["allreduce_explicit"]
             and ops.get("Broadcast", 0) >= issued["broadcast_explicit"] else "DIFFERS"],
            ["communicators", ", ".join(comms) or "none", "1 (world, size 1)", "ok" if len(comms) == 1 else "DIFFERS"],
            ["nccl.seq per communicator", "; ".join(f"{c}: {v[0]}..{v[-1]} ({len(v)})" for c, v in seqs.items()),
             "no gaps, no repeats", "ok" if contiguous else "DIFFERS"],
            _gpu_row(gpu, [int(k["dur_ns"]) for k in kern])]
    if not gpu and not kern:
        rows.append(["note", "NCCL 2.28 runs a 1-rank communicator's collectives as a local copy (enqueue.cc "
                     "taskAppend -> ncclLaunchOneRank): no kernel channels, so no plugin GPU time and no NCCL "
                     "kernel; the all_to_all's p2p-to-self did not give any here either", "", "info"])
    ok = all(r[3] in ("ok", "info") for r in rows)
    if not ok:  # where the run's host spans fell, so that a failure says whether they were missing or mistimed
        rows.append(["NCCL host spans of the whole run, start - t0 in ms", _host_spans_around(agent_out, w["t0_ns"]),
                     f"window: 0..{(w['t1_ns'] - w['t0_ns']) / 1e6:.1f}", "info"])
    return {"status": "pass" if ok else "fail", "workload": w, "ops": ops, "comms": comms, "seqs": seqs,
            "gpu_durations_ns": gpu[:50], "profiler_nccl_kernels": kern[:50], "rows": rows,
            "agent_stderr": _tail(d.err, 1500)}


def _host_spans_around(agent_out: Path, t0: int) -> str:
    """Every span of the agent's output with ``nccl.op`` or an NCCL name, as ``name seq @ms`` from ``t0``, and the
    output's span count by kind (the NCCL ones, the rest)."""
    from otel_ebpf.report.otlpfiles import read_otlp_json

    spans = sorted(read_otlp_json(agent_out).spans, key=lambda s: s.start_ns)
    nccl = [s for s in spans if s.get("nccl.op") or s.name.lower().startswith("nccl")]
    listed = "; ".join(f"{s.name} {s.get('nccl.seq')} @{(s.start_ns - t0) / 1e6:.1f}" for s in nccl[:80])
    return f"{len(nccl)} NCCL of {len(spans)} spans: {listed}"


def _gpu_row(gpu: list[int], kern: list[int]) -> Row:
    """Plugin GPU time against the profiler's NCCL kernel durations: same count, medians within 2x (the plugin
    times first channel start to last channel stop from the GPU's globaltimer, CUPTI the whole kernel)."""
    ours = f"{len(gpu)} spans, median {statistics.median(gpu) / 1e3:.1f} us" if gpu else "0 spans"
    ref = f"{len(kern)} kernels, median {statistics.median(kern) / 1e3:.1f} us" if kern else "0 kernels"
    if not gpu or not kern:
        return ["NCCL GPU time: plugin spans / profiler NCCL kernels", ours, ref, "info"]
    ratio = statistics.median(gpu) / max(1, statistics.median(kern))
    ok = len(gpu) == len(kern) and 0.5 <= ratio <= 2.0
    return ["NCCL GPU time: plugin spans / profiler NCCL kernels", ours, f"{ref} (ratio {ratio:.2f})",
            "ok" if ok else "DIFFERS"]


def probe_cost(t: Target, tmp: Path, budget: float) -> dict[str, Any]:
    """5a. cudaLaunchKernel on the libcudart torch loads here: untraced, an empty uprobe, the cuda receiver."""
    from probe_cost import measure

    return measure(t, tmp, budget)


def overhead(t: Target, tmp: Path, budget: float) -> dict[str, Any]:
    """5b. Per-step time of the training step, untraced vs traced (default pipeline), interleaved rounds."""
    rounds = 1 if t.quick else 2
    steps = "5" if t.quick else "30"
    runs: dict[str, list[float]] = {"untraced": [], "traced": []}
    deadline = time.monotonic() + budget
    small = ["--width", "256", "--batch", "32"] if t.name == "twin" else []
    for r in range(rounds):
        for mode in ("untraced", "traced"):
            left = deadline - time.monotonic()
            if left < 20:
                break
            wl = tmp / f"ovh-{mode}-{r}.json"
            cmd = _workload(t, "train_step.py", wl, "--steps", steps, "--pause", "0.2",
                            "--compile-backend", t.compile_backend, *small)
            if mode == "untraced":
                d = run_bounded(cmd, left, env=t.workload_env)
            else:
                d = agent_run(t, agent_config(tmp / "ovh.yaml", 1.0), tmp / f"ovh-agent-{r}", cmd, left,
                              env=t.workload_env)
            if d.rc == 0 and wl.exists():
                runs[mode].append(statistics.median(json.loads(wl.read_text())["step_ms"]))
    if not runs["untraced"] or not runs["traced"]:
        return {"status": "error", "runs": runs, "rows": [["per-step overhead", "incomplete", "", "ERROR"]]}
    u, tr = statistics.median(runs["untraced"]), statistics.median(runs["traced"])
    return {"status": "pass", "runs": runs, "untraced_ms": u, "traced_ms": tr,
            "rows": [["training step, untraced (median ms)", f"{u:.3f}", "", "info"],
                     ["training step, traced, default pipeline (median ms)", f"{tr:.3f}",
                      f"{(tr / u - 1) * 100:+.1f} % vs untraced", "info"]]}


