"""Lifecycle load under the agent: 10,000 short-lived processes, 1,000 threads at once, a process
that execs itself 200 times; all calling the REAL libcudart (tests/support/proc_storm.c).

Asserted for each: the agent and the command exit cleanly; the agent's RSS (sampled every
0.2 s) stays bounded; every call made is an exported span or a counted drop (lifecycle records,
process exits and library opens, may be counted as drops too, hence the upper bound); the traced
command's wall time stays within a bound of its untraced time. Figures printed with ``-s``.
``--soak``: 100,000 processes, 4,000 threads, 2,000 execs.
"""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from otel_ebpf.demo.build import compile_c
from tests.faults.agentproc import ROOT, SUPPORT, drops_by_reason
from tests.support.otlp_sink import metrics_from_jsonl, spans_from_jsonl

pytestmark = [pytest.mark.bpf, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def storm() -> Path:
    return compile_c(SUPPORT / "proc_storm.c", SUPPORT / "build" / "proc_storm", (), ("-ldl", "-lpthread"))


def _wall_ms(stdout: str) -> int:
    m = re.search(r"proc_storm \w+ calls=\d+ wall_ms=(\d+)", stdout)
    assert m, stdout
    return int(m.group(1))


def _traced(cmd: list[str], out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, int, float]:
    """Run ``otel-ebpf run [extra]`` around ``cmd``; (result, peak agent RSS bytes, seconds)."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "otel_ebpf", "run", *extra, "--output", str(out), "--", *cmd], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        try:
            ps = psutil.Process(p.pid)
            while p.poll() is None:
                peak[0] = max(peak[0], ps.memory_info().rss)
                time.sleep(0.2)
        except psutil.Error:
            pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = p.communicate(timeout=800)
    sampler.join(timeout=5)
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr), peak[0], time.monotonic() - t0


def _rate_limited(rows: list) -> int:
    """Largest cumulative otel_ebpf.spans.rate_limited{receiver=cuda}: calls counted in the
    kernel's metrics that the span budget (receivers.cuda.span_rate_limit) left without a span."""
    from tests.support.otlp_sink import decode_attrs

    return max((sum(dp.as_int for dp in m.sum.data_points if decode_attrs(dp.attributes).get("receiver") == "cuda")
                for _, m in rows if m.name == "otel_ebpf.spans.rate_limited"), default=0)


def _reconcile(out: Path, calls: int, lifecycle: int, names: tuple[str, ...]) -> tuple[int, dict[str, int]]:
    """Every call is a span, a counted drop, or counted as left without a span by the budget."""
    spans = sum(1 for _, _, s in spans_from_jsonl(out / "traces.jsonl") if s.name in names)
    rows = metrics_from_jsonl(out / "metrics.jsonl")
    drops = drops_by_reason(rows)
    limited = _rate_limited(rows)
    if limited:
        drops["cuda/rate_limited (not a drop: counted in the metrics)"] = limited
    total = spans + sum(drops.values())
    assert calls <= total <= calls + lifecycle, (calls, spans, drops)
    return spans, drops


def _run(storm: Path, cudart: Path, tmp: Path, args: list[str], calls: int, lifecycle: int,
         names: tuple[str, ...], max_rss_mib: int) -> str:
    plain = subprocess.run([str(storm), str(cudart), *args], capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr
    r, peak, secs = _traced([str(storm), str(cudart), *args], tmp / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    spans, drops = _reconcile(tmp / "out", calls, lifecycle, names)
    untraced, traced = _wall_ms(plain.stdout), _wall_ms(r.stdout)
    assert peak / 2**20 < max_rss_mib, f"agent RSS peaked at {peak / 2**20:.0f} MiB"
    assert traced <= 20 * untraced + 60_000, (traced, untraced)
    return (f"{' '.join(args)}: calls={calls} spans={spans} drops={drops} command wall {untraced} ms untraced, "
            f"{traced} ms traced; agent peak RSS {peak / 2**20:.0f} MiB, agent run {secs:.1f}s")


def test_ten_thousand_short_lived_processes(bpf_ready, cudart, storm, tmp_path, soak):
    n = 100_000 if soak else 10_000
    print("\n" + _run(storm, cudart, tmp_path, ["fork", str(n)], n, n + 10, ("cudaMemcpy",), 1024))


def test_thousand_threads_in_one_process(bpf_ready, cudart, storm, tmp_path, soak):
    n, k = (4000, 5) if soak else (1000, 2)
    print("\n" + _run(storm, cudart, tmp_path, ["threads", str(n), str(k)], 2 * n * k, 10,
                      ("cudaMalloc", "cudaMemcpy"), 1024))


def test_process_that_execs_itself_repeatedly(bpf_ready, cudart, storm, tmp_path, soak):
    n = 2000 if soak else 200
    print("\n" + _run(storm, cudart, tmp_path, ["exec", str(n)], n, 2 * n + 10, ("cudaMemcpy",), 1024))


def test_ring_buffer_flood_counts_drops_without_stalling_the_traced_process(bpf_ready, cudart, storm, tmp_path, soak):
    """One thread makes 2 x K calls as fast as it can. With a 4 KiB ring buffer most records find it
    full: they must be counted, and the caller must not wait for the agent (bpf_ringbuf_reserve fails
    at once), so its wall time stays that of the same run with the default 1 MiB ring."""
    k = 200_000 if soak else 50_000
    args = [str(storm), str(cudart), "threads", "1", str(k)]
    cfg = tmp_path / "tiny-ring.yaml"
    # a record per call (no span budget), so the flood reaches the ring buffer
    cfg.write_text("receivers:\n  cuda:\n    ringbuf_pages: 1\n    span_rate_limit: 0\n")
    cfg.chmod(0o600)
    big_cfg = tmp_path / "big-ring.yaml"
    big_cfg.write_text("receivers:\n  cuda:\n    span_rate_limit: 0\n")
    big_cfg.chmod(0o600)
    plain = subprocess.run(args, capture_output=True, text=True, timeout=600)
    big, _, _ = _traced(args, tmp_path / "big", "--config", str(big_cfg))
    tiny, peak, _ = _traced(args, tmp_path / "tiny", "--config", str(cfg))
    assert big.returncode == 0 and tiny.returncode == 0, tiny.stderr[-3000:]
    spans, drops = _reconcile(tmp_path / "tiny", 2 * k, 10, ("cudaMalloc", "cudaMemcpy"))
    assert drops.get("cuda/ringbuf_full", 0) > 0, drops
    big_ms, tiny_ms = _wall_ms(big.stdout), _wall_ms(tiny.stdout)
    assert tiny_ms <= 1.5 * big_ms + 500, (tiny_ms, big_ms)
    print(f"\nflood 2x{k} calls: untraced {_wall_ms(plain.stdout)} ms, 1 MiB ring {big_ms} ms, "
          f"4 KiB ring {tiny_ms} ms; spans={spans} drops={drops}; "
          f"agent peak RSS {peak / 2**20:.0f} MiB")
