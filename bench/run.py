"""otel-ebpf benchmarks, one command: ``sudo .venv/bin/python bench/run.py [--calls N]``.

Prints a Markdown table (and writes it with --write docs/benchmarks.md section markers):

1. probe cost on the REAL libcudart's cudaLaunchKernel: untraced vs an empty uprobe vs the
   CUDA receiver's program (ratio to the empty uprobe; target <= 1.15);
2. pipeline: cudaMemcpy calls (one span each) pushed through the whole agent (BPF -> ring
   buffer -> processors -> SDK -> OTLP JSON file): calls seen vs made, events/s drained,
   agent CPU per event;
3. agent RSS after that load, and time from agent start to its first event;
4. (``--compare``) the same probes through an eACGM-style pipeline (bpf_trace_printk +
   trace_pipe parsing, ``bench/eacgm_style.py``) in the same run: the highest zero-loss rate
   of each, for cudaMemcpy (ours twice: one span per call, ``span_rate_limit: 0``; and the
   default, every call counted in the kernel and spans within the budget) and cudaLaunchKernel
   (a span per launch there, in-kernel counting here). Rates are the ones the loop achieved.

Every figure is measured in the run that prints it; nothing is carried over.
"""
from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_ebpf.core import gctune  # noqa: E402


def build_loop() -> Path:
    out = Path(tempfile.gettempdir()) / "otel-ebpf-bench" / "cuda_loop"
    out.parent.mkdir(exist_ok=True)
    src = ROOT / "bench" / "cuda_loop.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-O1", "-fno-omit-frame-pointer", "-o", str(out), str(src), "-ldl"], check=True)
    return out


def cudart() -> str:
    from tests.support.build import real_cudart

    path = real_cudart()
    if path is None:
        sys.exit("bench: nvidia-cuda-runtime-cu12 is not installed (pip install -e '.[test]')")
    return str(path)


def start_loop(loop: Path, api: str, n: int, rate: float = 0) -> subprocess.Popen:
    # pinned to one CPU so runs compare like with like (the agent's threads run elsewhere)
    pin = ["taskset", "-c", str(os.cpu_count() - 1)] if os.cpu_count() and os.cpu_count() > 1 else []
    p = subprocess.Popen([*pin, str(loop), cudart(), api, str(n), "--wait-stdin", "--rate", str(rate)],
                         stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def finish_loop(p: subprocess.Popen) -> float:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("go\n")
    p.stdin.flush()
    line = p.stdout.readline()
    p.wait(timeout=300)
    m = re.search(r"ns_per_call=([0-9.]+)", line)
    if not m:
        raise RuntimeError(f"cuda_loop printed {line!r}")
    return float(m.group(1))


def untraced(loop: Path, n: int) -> float:
    return finish_loop(start_loop(loop, "launch", n))


def bare_uprobe(loop: Path, n: int) -> float:
    from bcc import BPF

    from otel_ebpf.bpf.links import attach_one

    undo = attach_one(BPF(text="int bare(struct pt_regs *ctx) { return 0; }"), cudart(), "cudaLaunchKernel", "bare")
    try:
        return finish_loop(start_loop(loop, "launch", n))
    finally:
        undo()


CUDA_CONFIG: dict = {}  # --no-launch-context: {"launch_context": False}
DEFAULT_GC = False  # --default-gc
EXPORT: dict[str, str] = {}  # --otlp: the null collector's {"endpoint": ..., "protocol": ...}
EXPORTER: dict[str, object] = {}  # --gzip: the otlp exporter's settings beside them


def null_collector(protocol: str) -> subprocess.Popen:
    """bench/otlp_export.py's null collector (answers OK, parses nothing) in its own process;
    sets EXPORT to its endpoint. Ends when its stdin closes."""
    p = subprocess.Popen([sys.executable, str(ROOT / "bench" / "otlp_export.py"), "--serve"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    ports = dict(kv.split("=") for kv in p.stdout.readline().split())
    EXPORT.update(endpoint=f"127.0.0.1:{ports['grpc']}" if protocol == "grpc" else f"http://127.0.0.1:{ports['http']}",
                  protocol=protocol)
    return p


def agent_for(pid: int | list[int], out_dir: str, receivers: list[str], **cuda: object):
    from otel_ebpf.service import settings
    from otel_ebpf.service.agent import Agent

    procs = [r for r in receivers]
    extra = {"receivers": {"cuda": CUDA_CONFIG | cuda}, "service": {
        "pipelines": {"default": {"receivers": receivers, "processors": procs}}, "metrics_interval": 1.0}}
    if EXPORTER:
        extra["exporters"] = {"otlp": dict(EXPORTER)}
    cfg = settings.load(None, output=None if EXPORT else out_dir, extra=extra, **EXPORT)
    return Agent(cfg, target_pids=pid if isinstance(pid, list) else [pid])


def traced_launch(loop: Path, n: int) -> float:
    p = start_loop(loop, "launch", n)
    with tempfile.TemporaryDirectory() as d:
        agent = agent_for(p.pid, d, ["cuda"])
        agent.start()
        try:
            return finish_loop(p)
        finally:
            agent.shutdown()


class CollectorTime:
    """Seconds the cyclic garbage collector ran while :attr:`on` (gc.callbacks), and its passes by generation."""

    def __init__(self) -> None:
        self.on, self.seconds, self.passes, self._t0 = False, 0.0, [0, 0, 0], 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self.on:
            self.seconds += time.perf_counter() - self._t0
            self.passes[info["generation"]] += 1


COLLECTOR = CollectorTime()


def pipeline_at(loop: Path, rate: float, seconds: float) -> dict[str, float]:
    """cudaMemcpy at ``rate`` calls/s for ``seconds`` through the whole agent (file exporter, or
    OTLP to a null collector with --otlp), every call a span (``span_rate_limit: 0``). The agent's process
    has the collector settings ``otel-ebpf run`` gives it (otel_ebpf.core.gctune) unless --default-gc."""
    me = psutil.Process()
    n = int(rate * seconds)
    p = start_loop(loop, "memcpy", n, rate)
    with tempfile.TemporaryDirectory() as d:
        agent = agent_for(p.pid, d, ["cuda"], span_rate_limit=0)
        agent.start()
        if not DEFAULT_GC:
            gctune.freeze_startup()
        gc_s, gc_passes = COLLECTOR.seconds, list(COLLECTOR.passes)
        COLLECTOR.on = True
        cpu0 = me.cpu_times()
        ns_per_call = finish_loop(p)
        tel = agent.ctx.telemetry
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and tel.get("otel_ebpf.events.received", receiver="cuda") + \
                tel.get("otel_ebpf.events.dropped") < n:
            time.sleep(0.05)
        agent.shutdown()  # includes exporting every span to the file
        cpu1 = me.cpu_times()
        COLLECTOR.on = False
        rss = me.memory_info().rss
        spans = agent.summary()["spans"]
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    lost: Counter[str] = Counter()
    for name, attrs, v in tel.snapshot():
        if name == "otel_ebpf.events.dropped" and v:
            lost[attrs.get("reason", "?")] += v
    return {"rate": rate, "calls": n, "spans": spans, "dropped": tel.get("otel_ebpf.events.dropped"), "lost": lost,
            "cpu_us_per_span": cpu / max(spans, 1) * 1e6, "rss_mb": rss / 2**20,
            "gc_us_per_span": (COLLECTOR.seconds - gc_s) / max(spans, 1) * 1e6,
            "gc_passes": [b - a for a, b in zip(gc_passes, COLLECTOR.passes, strict=True)],
            "achieved": min(rate, 1e9 / ns_per_call)}


def pipeline(loop: Path, rates: list[float], seconds: float) -> tuple[dict[str, float] | None, list[dict]]:
    """The highest rate with zero loss (every call a span, no drop), and every run."""
    best, runs = None, []
    for rate in rates:
        r = pipeline_at(loop, rate, seconds)
        runs.append(r)
        if r["dropped"] == 0 and r["spans"] >= r["calls"]:
            best = r
        else:
            break
    return best, runs


def launches_exported(out_dir: str) -> int:
    """Kernel launches the agent's exporters received: the last cumulative value of each
    ``gpu.cuda.kernel.launch.calls`` series in metrics.jsonl, summed."""
    return _last_cumulative(out_dir, "gpu.cuda.kernel.launch.calls", "sum",
                            lambda dp: int(dp.get("asInt", dp.get("asDouble", 0))))


def _last_cumulative(out_dir: str, name: str, points: str, value: Callable[[dict], int]) -> int:
    """The last cumulative value of each series of metric ``name`` in metrics.jsonl, summed."""
    import json

    last: dict[str, int] = {}
    path = Path(out_dir) / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        for rm in json.loads(line).get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for m in sm.get("metrics", []):
                    if m.get("name") != name:
                        continue
                    for dp in m.get(points, {}).get("dataPoints", []):
                        key = json.dumps([rm.get("resource"), dp.get("attributes")], sort_keys=True)
                        last[key] = value(dp)
    return sum(last.values())


def copies_counted(out_dir: str) -> int:
    """cudaMemcpy calls the exporters received as counts: gpu.cuda.memory.copy.duration counts."""
    return _last_cumulative(out_dir, "gpu.cuda.memory.copy.duration", "histogram", lambda dp: int(dp.get("count", 0)))


def ours_at(loop: Path, api: str, rate: float, seconds: float, budget: bool = False) -> dict[str, float]:
    """Our agent on ``api`` at ``rate`` calls/s: memcpy -> a span per call (``budget``: the
    default span budget, every call counted in the kernel), launch -> in-kernel counts."""
    if api == "memcpy" and not budget:
        r = pipeline_at(loop, rate, seconds)
        return {"calls": r["calls"], "seen": r["spans"], "dropped": r["dropped"], "achieved": r["achieved"]}
    n = int(rate * seconds)
    p = start_loop(loop, api, n, rate)
    with tempfile.TemporaryDirectory() as d:
        agent = agent_for(p.pid, d, ["cuda"])
        agent.start()
        ns_per_call = finish_loop(p)
        time.sleep(1.5)  # > stats_interval: the last counters are read
        agent.shutdown()
        seen = launches_exported(d) if api == "launch" else copies_counted(d)
        spans = agent.summary()["spans"]
    return {"calls": n, "seen": seen, "dropped": agent.ctx.telemetry.get("otel_ebpf.events.dropped"),
            "achieved": min(rate, 1e9 / ns_per_call), "spans": spans}


def eacgm_at(loop: Path, api: str, rate: float, seconds: float) -> dict[str, float]:
    from bench.eacgm_style import EacgmStylePipeline

    n = int(rate * seconds)
    p = start_loop(loop, api, n, rate)
    pipe = EacgmStylePipeline(cudart(), "cudaMemcpy" if api == "memcpy" else "cudaLaunchKernel", pid=p.pid)
    pipe.start()
    ns_per_call = finish_loop(p)
    spans = pipe.stop()
    return {"calls": n, "seen": spans, "dropped": n - spans, "achieved": min(rate, 1e9 / ns_per_call)}


def zero_loss(run, loop: Path, api: str, rates: list[float], seconds: float) -> tuple[float, list[dict]]:
    """The highest achieved rate at which every call was exported, and every run."""
    best, runs = 0.0, []
    for rate in rates:
        r = run(loop, api, rate, seconds) | {"rate": rate}
        runs.append(r)
        if r["seen"] >= r["calls"] and not r["dropped"]:
            best = max(best, r["achieved"])
            if r["achieved"] < 0.95 * rate:  # the loop itself cannot go faster
                break
        else:
            break
    return best, runs


def compare(loop: Path, seconds: float) -> list[tuple[str, str]]:
    rows = []
    memcpy = [2000.0, 5000, 7500, 10000, 15000, 20000, 25000, 30000, 40000]
    plans = [("memcpy", "a span per call", memcpy, False),
             ("memcpy", "default: counted in the kernel, spans within the budget",
              [*memcpy, 60000, 100000, 200000, 400000], True),
             ("launch", "in-kernel counts", [1000.0, 2500, 5000, 10000, 20000, 50000, 100000, 200000, 400000,
                                            800000], False)]
    theirs_by_api: dict[str, tuple[float, list[dict]]] = {}
    for api, how, rates, budget in plans:
        ours, ours_runs = zero_loss(lambda lp, a, r, s, b=budget: ours_at(lp, a, r, s, b), loop, api, rates, seconds)
        if api not in theirs_by_api:
            theirs_by_api[api] = zero_loss(eacgm_at, loop, api, rates, seconds)
            for r in theirs_by_api[api][1]:
                rows.append((f"eACGM-style, {api} at {r['rate']:.0f}/s for {seconds:.0f} s",
                             f"{r['seen']:.0f} of {r['calls']:.0f} calls exported as spans"))
        theirs = theirs_by_api[api][0]
        for r in ours_runs:
            what = "counted in metrics" if budget or api == "launch" else "exported as spans"
            extra = f" ({r['spans']:.0f} spans)" if budget else ""
            rows.append((f"otel-ebpf ({how}), {api} at {r['rate']:.0f}/s for {seconds:.0f} s",
                         f"{r['seen']:.0f} of {r['calls']:.0f} calls {what}{extra}, {r['dropped']:.0f} dropped; "
                         f"loop achieved {r['achieved']:.0f}/s"))
        ratio = f"{ours / theirs:.1f}x" if theirs else "n/a (eACGM-style lost calls at every rate)"
        rows.append((f"**{api}, {how}: highest zero-loss rate, otel-ebpf vs eACGM-style**",
                     f"**{ours:.0f}/s vs {theirs:.0f}/s: {ratio}**"
                     + (" (ours held every rate tried)" if ours >= 0.95 * rates[-1] else "")))
    return rows


def first_event_latency(loop: Path) -> float:
    p = start_loop(loop, "memcpy", 1)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        agent = agent_for(p.pid, d, ["cuda"])
        agent.start()
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
        while agent.ctx.telemetry.get("otel_ebpf.events.received") == 0 and time.monotonic() - t0 < 60:
            time.sleep(0.005)
        dt = time.monotonic() - t0
        p.wait(timeout=30)
        agent.shutdown()
    return dt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200_000, help="calls per probe-cost measurement")
    ap.add_argument("--rates", default="2000,5000,10000,20000,40000",
                    help="cudaMemcpy calls/s tried in turn for the zero-loss pipeline figure")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each pipeline run")
    ap.add_argument("--repeat", type=int, default=5, help="probe-cost runs; the median is reported")
    ap.add_argument("--probe-only", action="store_true", help="only the probe-cost rows")
    ap.add_argument("--compare", action="store_true", help="also the eACGM-style pipeline comparison")
    ap.add_argument("--compare-only", action="store_true", help="only the eACGM-style comparison")
    ap.add_argument("--pipeline-only", action="store_true", help="only the pipeline rows")
    ap.add_argument("--otlp", choices=("grpc", "http"),
                    help="pipeline rows export over OTLP to a null collector in another process (default: the file)")
    ap.add_argument("--gzip", action="store_true",
                    help="with --otlp: the exporter compresses with gzip (compression: gzip; auto sends a loopback "
                         "endpoint uncompressed)")
    ap.add_argument("--no-launch-context", action="store_true",
                    help="CUDA receiver with launch_context: false (no per-thread op lookup on launches)")
    ap.add_argument("--default-gc", action="store_true",
                    help="the agent keeps CPython's collector settings (700, 10, 10; no freeze) instead of the ones "
                         "otel-ebpf run sets (otel_ebpf.core.gctune)")
    ap.add_argument("--bcc-rings", action="store_true",
                    help="receivers read their ring buffers through BCC's per-record callbacks, not the C reader "
                         "(otel_ebpf.bpf.ringread)")
    ap.add_argument("--python-decode", action="store_true",
                    help="receivers decode every record in Python, not their hot record types in C "
                         "(otel_ebpf.bpf.records)")
    ap.add_argument("--python-encoders", action="store_true",
                    help="spans encoded by the Python writers, not the C extension (otel_ebpf.emit.otlp_native): "
                         "what the encoder costs the whole agent")
    a = ap.parse_args()
    global DEFAULT_GC
    DEFAULT_GC = a.default_gc
    if a.gzip:
        if not a.otlp:
            ap.error("--gzip needs --otlp")
        EXPORTER["compression"] = "gzip"
    if not DEFAULT_GC:
        gctune.tune()
    if a.bcc_rings:
        from otel_ebpf.bpf import ringread

        ringread.use_native = False
    if a.python_decode:
        from otel_ebpf.bpf import records

        records.use_native = False
    if a.python_encoders:
        from otel_ebpf.emit import otlp_native

        otlp_native.SPANS_PROTO = otlp_native.SPANS_JSON = None
    if a.no_launch_context:
        CUDA_CONFIG["launch_context"] = False
    if os.geteuid() != 0:
        sys.exit("bench: needs root (BPF)")
    loop = build_loop()
    collector = null_collector(a.otlp) if a.otlp else None
    try:
        return _run(a, loop)
    finally:
        if collector is not None and collector.stdin is not None:
            collector.stdin.close()
            collector.wait(timeout=10)


def _run(a: argparse.Namespace, loop: Path) -> int:
    if a.pipeline_only:
        best, runs = pipeline(loop, [float(r) for r in a.rates.split(",")], a.seconds)
        _table(_pipeline_rows(a, best, runs))
        return 0
    if a.compare_only:
        _table(compare(loop, a.seconds))
        return 0

    # interleaved (untraced, bare, ours, untraced, ...) so drift hits all three alike; medians
    runs: dict[str, list[float]] = {"base": [], "bare": [], "ours": []}
    for _ in range(a.repeat):
        for key, f in (("base", untraced), ("bare", bare_uprobe), ("ours", traced_launch)):
            runs[key].append(f(loop, a.calls))
    base, bare, ours = (sorted(v)[len(v) // 2] for v in (runs["base"], runs["bare"], runs["ours"]))
    if a.probe_only:
        print(f"untraced {base:.0f} ns, empty uprobe {bare:.0f} ns, receiver {ours:.0f} ns: ratio {ours / bare:.3f}")
        return 0
    best, runs = pipeline(loop, [float(r) for r in a.rates.split(",")], a.seconds)
    first = first_event_latency(loop)
    last = runs[-1]
    rows = [("cudaLaunchKernel untraced", f"{base:.0f} ns/call"),
            ("cudaLaunchKernel, empty uprobe", f"{bare:.0f} ns/call"),
            ("cudaLaunchKernel, CUDA receiver", f"{ours:.0f} ns/call"),
            ("**receiver / empty uprobe**", f"**{ours / bare:.2f}** (target <= 1.15)")]
    rows += _pipeline_rows(a, best, runs)
    rows += [("agent RSS after the last run", f"{last['rss_mb']:.0f} MiB"),
             ("agent start to first event", f"{first:.2f} s")]
    if a.compare:
        rows += compare(loop, a.seconds)
    _table(rows)
    return 0


def _pipeline_rows(a: argparse.Namespace, best: dict[str, float] | None, runs: list[dict]) -> list[tuple[str, str]]:
    to = (f"OTLP/{a.otlp}{' gzip' if a.gzip else ''} to a null collector") if a.otlp else "the JSON-lines file"
    rows = [(f"cudaMemcpy at {r['rate']:.0f}/s (loop achieved {r['achieved']:.0f}/s) for {a.seconds:.0f} s, "
             f"whole agent, to {to}",
             f"{r['spans']:.0f} of {r['calls']:.0f} calls became spans, {r['dropped']:.0f} lost, counted"
             f"{' (' + ', '.join(f'{k} {v}' for k, v in sorted(r['lost'].items())) + ')' if r['lost'] else ''}; "
             f"{r['cpu_us_per_span']:.1f} us agent CPU per span, {r['gc_us_per_span']:.1f} us of it in the garbage "
             f"collector ({'/'.join(map(str, r['gc_passes']))} passes by generation)") for r in runs]
    return [*rows, ("**highest zero-loss rate tried**", f"**{best['rate']:.0f} spans/s**" if best else "none")]


def _table(rows: list[tuple[str, str]]) -> None:
    print("| figure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
