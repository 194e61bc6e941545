"""Helpers of the fault suite: the agent as a subprocess, its BPF objects, its exported counters.

Other agents may run on the same host at the same time (CI jobs, other tests), so BPF objects
are always identified by the owning process (its fds), never by a global listing being empty.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"


def agent(*args: str, stderr: Path) -> subprocess.Popen[bytes]:
    """``otel-ebpf ARGS`` in the background, stderr to a file (read it for failures)."""
    return subprocess.Popen([sys.executable, "-m", "otel_ebpf", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(stderr, "wb"))


def bpf_ids(pid: int) -> dict[str, set[int]]:
    """{'prog': ids, 'map': ids, 'link': ids} held by process ``pid``'s fds (from fdinfo)."""
    out: dict[str, set[int]] = {"prog": set(), "map": set(), "link": set()}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            kind = {"prog_id": "prog", "map_id": "map", "link_id": "link"}.get(key.strip())
            if kind and value.strip().isdigit():
                out[kind].add(int(value))
    return out


def perf_event_fds(pid: int) -> int:
    """How many perf-event fds ``pid`` holds (BCC attaches uprobes and tracepoints through them)."""
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]"
            except OSError:
                pass
    except OSError:
        pass
    return n


def live_bpf_ids() -> dict[str, set[int]] | None:
    """Every prog/map/link id the kernel has now, from ``bpftool`` (None when it is missing)."""
    tool = shutil.which("bpftool") or ("/usr/sbin/bpftool" if os.path.exists("/usr/sbin/bpftool") else None)
    if tool is None:
        return None
    out: dict[str, set[int]] = {}
    for kind in ("prog", "map", "link"):
        r = subprocess.run([tool, "-j", kind, "show"], capture_output=True, text=True, timeout=60)
        out[kind] = {item["id"] for item in json.loads(r.stdout or "[]")} if r.returncode == 0 else set()
    return out


def held_by_anyone(ids: dict[str, set[int]]) -> dict[str, set[int]]:
    """Without bpftool: which of ``ids`` some live process still holds an fd to."""
    held: dict[str, set[int]] = {k: set() for k in ids}
    for d in os.listdir("/proc"):
        if d.isdigit():
            for k, v in bpf_ids(int(d)).items():
                held[k] |= v & ids[k]
    return held


def still_loaded(ids: dict[str, set[int]]) -> dict[str, set[int]]:
    live = live_bpf_ids()
    if live is None:
        return held_by_anyone(ids)
    return {k: ids[k] & live.get(k, set()) for k in ids}


def uprobe_events_of(pid: int) -> list[str]:
    """Lines of tracefs uprobe_events that BCC created for process ``pid`` (named ``..._bcc_<pid>``;
    BCC uses them only where the kernel lacks the uprobe PMU, but a leftover would be one)."""
    for base in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        p = Path(base) / "uprobe_events"
        if p.exists():
            return [line for line in p.read_text().splitlines() if f"bcc_{pid}" in line]
    return []


def wait_until(pred: Callable[[], object], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return bool(pred())


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc/PID/stat (R, S, T, Z...), None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1]


def counter_total(rows: Iterable, name: str, **attrs: str) -> int:
    """Largest cumulative value of a Sum metric over the rows, summed over points matching ``attrs``."""
    from tests.support.otlp_sink import decode_attrs

    best = 0
    for _, m in rows:
        if m.name != name:
            continue
        total = sum(dp.as_int for dp in m.sum.data_points
                    if all(decode_attrs(dp.attributes).get(k) == v for k, v in attrs.items()))
        best = max(best, total)
    return best


#: drop counters that can hold a traced CUDA call: its receiver, the pipeline queue, emit and exporters
#: (other receivers in the default pipeline, e.g. blockio, count their own, unrelated drops)
CALL_PATH = ("cuda", "default", "emit", "otlp", "file")


def drops_by_reason(rows: Iterable, receivers: Iterable[str] = CALL_PATH) -> dict[str, int]:
    """{reason: largest cumulative otel_ebpf.events.dropped} over the drops of ``receivers``."""
    from tests.support.otlp_sink import decode_attrs

    wanted = set(receivers)
    best: dict[str, int] = {}
    for _, m in rows:
        if m.name != "otel_ebpf.events.dropped":
            continue
        totals: dict[str, int] = {}
        for dp in m.sum.data_points:
            a = decode_attrs(dp.attributes)
            if a.get("receiver") in wanted:
                key = f"{a.get('receiver')}/{a.get('reason')}"
                totals[key] = totals.get(key, 0) + dp.as_int
        for k, v in totals.items():
            best[k] = max(best.get(k, 0), v)
    return best


def loop_cmd(cudart: Path, tmp: Path, *, nccl: Path | None = None, sleep_ms: float = 5,
             max_s: float = 180) -> list[str]:
    """The cuda_loop.py workload; its pid lands in tmp/pid, touch tmp/stop to end it."""
    cmd = [sys.executable, str(SUPPORT / "cuda_loop.py"), str(cudart), "--pidfile", str(tmp / "pid"),
           "--stop", str(tmp / "stop"), "--sleep-ms", str(sleep_ms), "--max-s", str(max_s)]
    return cmd + (["--nccl", str(nccl)] if nccl else [])


def loop_calls(tmp: Path) -> int:
    return int((tmp / "stop.count").read_text().split("=")[1])
