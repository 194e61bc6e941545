"""What the GPU proof's steps share: where workloads run (:class:`Target`), bounded subprocesses that leave
nothing behind (:func:`run_bounded`), the agent's command line and config, and reading its output."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["HERE", "ROOT", "Done", "Target", "agent_config", "agent_run", "launch_window", "run_bounded", "snapshots"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@dataclass
class Target:
    """Where the proof runs. ``gpu``: the machine's python3 and GPU; ``twin``: .venv-twin's torch on stand-ins."""

    name: str
    agent_python: str
    workload_python: str
    workload_env: dict[str, str]
    compile_backend: str
    nvml_env: dict[str, str] = field(default_factory=dict)
    quick: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class Done:
    rc: int
    out: str
    err: str
    seconds: float
    timed_out: bool


def run_bounded(cmd: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
                cwd: Path | None = None) -> Done:
    """Run ``cmd`` in its own process group; at ``timeout`` SIGTERM the group, 5 s later SIGKILL it. Whatever
    happens (an exception here included), nothing of it is left running when this returns."""
    start = time.monotonic()
    p = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(env) if env is not None else None, cwd=cwd or ROOT, start_new_session=True)
    timed_out = False
    try:
        out, err = p.communicate(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(p.pid, signal.SIGTERM)
        try:
            out, err = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_group(p.pid, signal.SIGKILL)
            out, err = p.communicate()
    finally:
        if p.poll() is None:
            _kill_group(p.pid, signal.SIGKILL)
            p.wait()
        _kill_group(p.pid, signal.SIGKILL)  # children that outlived their leader
    return Done(p.returncode, out or "", err or "", time.monotonic() - start, timed_out)


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def agent_config(path: Path, metrics_interval: float = 0.1, extra: dict[str, Any] | None = None) -> Path:
    """The default pipeline (settings.default_data), metrics exported every ``metrics_interval`` s."""
    from otel_ebpf.service import settings

    pipe = settings.default_data()["service"]["pipelines"]["default"]
    cfg: dict[str, Any] = {"service": {"pipelines": {"default": pipe}, "metrics_interval": metrics_interval,
                                       "health_endpoint": ""}}
    for k, v in (extra or {}).items():
        cfg.setdefault(k, {}).update(v)
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


def agent_run(t: Target, cfg: Path, out: Path, command: Sequence[str], timeout: float,
              env: Mapping[str, str] | None = None) -> Done:
    cmd = [t.agent_python, "-m", "otel_ebpf", "run", "--config", str(cfg), "--output", str(out), "--", *command]
    return run_bounded(cmd, timeout, env=env)


def snapshots(out: Path, name: str, keep: Callable[[dict[str, Any]], bool],
              field: str = "value") -> list[tuple[int, float]]:
    """(export time, sum over the kept series) of a cumulative counter (``field="count"``: of a cumulative
    histogram's counts), one row per export. Each series (resource and attributes) adds its latest value at or
    before that export, so two exports close together (the last periodic one and the flush at exit, often under
    10 ms apart) never read as one export of twice the count. The export times are those of every series of
    ``name``, kept or not, so two calls with different ``keep`` give rows at the same times."""
    from otel_ebpf.report.otlpfiles import read_otlp_json

    series: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    buckets: dict[int, int] = {}  # one export's points are collected within 10 ms; a bucket reads at its last
    for p in read_otlp_json(out).metrics:  # sorted by time
        if p.name != name:
            continue
        b = p.time_ns // 10_000_000
        buckets[b] = max(buckets.get(b, 0), p.time_ns)
        if keep(p.attributes):
            key = (repr(sorted(p.resource.items())), repr(sorted(p.attributes.items())))
            series[key].append((p.time_ns, float(getattr(p, field) or 0.0)))
    rows = []
    for ts in sorted(buckets.values()):
        total = 0.0
        for points in series.values():
            latest = [v for t, v in points if t <= ts]
            total += latest[-1] if latest else 0.0
        rows.append((ts, total))
    return rows


def launch_window(out: Path, name: str, t0: int, t1: int, keep: Callable[[dict[str, Any]], bool],
                  field: str = "value") -> int | None:
    """What a cumulative counter gained between epoch-ns ``t0`` and ``t1``: the last export at or before t0 and
    the first export at or after t1 (the workload pauses around its window, so both read the window's edges).
    None when the exports do not bracket the window."""
    snaps = snapshots(out, name, lambda a: True, field)
    if not snaps or snaps[-1][0] < t1:
        return None
    kept = dict(snapshots(out, name, keep, field))
    before = max((ts for ts, _ in snaps if ts <= t0), default=None)
    after = min(ts for ts, _ in snaps if ts >= t1)
    base = kept.get(before, 0.0) if before is not None else 0.0
    return int(kept.get(after, 0.0) - base)
