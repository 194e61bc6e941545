"""otel_ebpf.Session (the Python API) on real processes: tests/support/cuda_driver driving NVIDIA's
libcudart.so.12 (no GPU: every call returns 35, the probes still fire). Every wait is bounded."""
from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import pytest

import otel_ebpf
from otel_ebpf.bpf import links
from tests.support.uprobe_links import uprobe_links
from otel_ebpf.core.errors import ConfigError, OtelEbpfError, TargetError
from otel_ebpf.core.events import ProcessExit, SpanRecord
from otel_ebpf.receivers.cuda.events import MemcpyCall

pytestmark = pytest.mark.bpf


def _session(built: dict[str, Path], cudart: Path, **kw: object) -> otel_ebpf.Session:
    return otel_ebpf.Session(command=[str(built["cuda_driver"]), str(cudart)], receivers=("cuda",),
                             config={"receivers": {"cuda": {"libraries": [str(cudart)]}}}, **kw)  # type: ignore[arg-type]


def test_sample_returns_the_commands_memcpy_calls_and_leaving_detaches(bpf_ready: None, built: dict[str, Path],
                                                                        cudart: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    with _session(built, cudart) as s:
        rx = s.receivers["cuda"]
        bpf = rx.bpf
        assert rx.open_uprobes() >= 32
        # as links where the kernel has uprobe_multi (6.6+, this project's CI), so leaving is quick
        assert len(uprobe_links()) >= 32 or not links.supported()
        events = s.sample(seconds=30.0)  # returns once the command has exited and its records are read
        assert time.monotonic() - started < 60
        memcpy = [e for e in events if isinstance(e, MemcpyCall)]
        assert [(m.api, m.bytes, m.kind, m.rc) for m in memcpy] == [("cudaMemcpy", 65536, 1, 35),
                                                                    ("cudaMemcpyAsync", 32768, 2, 35)]
        assert all(m.pid == s.pids[0] for m in memcpy)
        assert any(isinstance(e, ProcessExit) and e.pid == s.pids[0] for e in events)
        assert s.exit_code == 0 and s.dropped == 0
        with pytest.raises(TargetError, match=r"exited with code 0; every event was already returned"):
            s.sample(seconds=1.0)
        paths = s.to_parquet(tmp_path)
        assert {"MemcpyCall", "SetDeviceCall", "ProcessExit"} <= set(paths)
    assert rx.bpf is None and rx.open_uprobes() == 0 and bpf.num_open_uprobes() == 0  # every uprobe detached
    assert not uprobe_links()  # not one uprobe link left open in this process (otel_ebpf.bpf.links)
    leftovers: list[object] = []
    with pytest.raises(OtelEbpfError, match="not running"):  # after what the final drain read, if anything
        for _ in range(3):
            leftovers += s.sample(0)
    assert not any(isinstance(e, MemcpyCall) for e in leftovers)
    s.close()  # twice: safe


def test_processed_session_returns_spans_and_a_full_buffer_counts_drops(bpf_ready: None, built: dict[str, Path],
                                                                        cudart: Path) -> None:
    with _session(built, cudart, processed=True) as s:
        spans = [e for e in s.sample(seconds=30.0) if isinstance(e, SpanRecord)]
        assert [sp.name for sp in spans if sp.name.startswith("cudaMemcpy")] == ["cudaMemcpy", "cudaMemcpyAsync"]
        assert next(sp for sp in spans if sp.name == "cudaMemcpy").attributes["cuda.bytes"] == 65536
    with _session(built, cudart, max_events=2) as s:
        events = s.sample(seconds=30.0)
        # the oldest are kept (the dlopen, the first calls), not the later memcpys
        assert len(events) == 2 and not any(isinstance(e, MemcpyCall) for e in events)
        assert s.dropped > 0
        assert s.ctx.telemetry.get("otel_ebpf.events.dropped", receiver="api", reason="buffer_full") == s.dropped


def test_dead_pid_and_bad_config_are_clear_errors() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    with pytest.raises(TargetError, match=f"no process with PID {proc.pid}"):
        with otel_ebpf.Session(pids=[proc.pid]):
            pass
    with pytest.raises(TargetError, match="exactly one of"):
        otel_ebpf.Session()
    with pytest.raises(ConfigError, match=r"'receivers\.nope'"):
        otel_ebpf.Session(pids=[1], receivers=("nope",))
    with pytest.raises(ConfigError, match=r"'receivers\.cuda\.bogus'"):
        otel_ebpf.Session(pids=[1], config={"receivers": {"cuda": {"bogus": 1}}})
    with pytest.raises(ConfigError, match="'max_events'"):
        otel_ebpf.Session(pids=[1], max_events=0)


def test_one_process_exit_per_process_with_several_receivers(bpf_ready: None) -> None:
    """Issue 18: every BPF receiver reports each exit (ProcessExit.source), so a session with
    two receivers returned two for one process. The first is kept, with its source."""
    with otel_ebpf.Session(command=["/bin/sh", "-c", "sleep 0.2; /bin/true"], receivers=("sched", "memory")) as s:
        events: list[object] = []
        with contextlib.suppress(TargetError):
            for _ in range(20):
                events += s.sample(seconds=5.0)
    exits = [e for e in events + s.collected[len(events):] if isinstance(e, ProcessExit) and e.pid == s.pids[0]]
    assert len(exits) == 1 and exits[0].source in ("sched", "memory"), exits
