"""After start the agent gives back the compiler's memory, and compiling again still works."""
from __future__ import annotations

import subprocess

import psutil
import pytest

from otel_ebpf.service import settings
from otel_ebpf.service.agent import Agent

pytestmark = pytest.mark.bpf


def _llvm_rss() -> int:
    return sum(m.rss for m in psutil.Process().memory_maps(grouped=True)
               if "libLLVM" in m.path or "libclang" in m.path)


def _agent(pid: int, out: str) -> Agent:
    cfg = settings.load(None, output=out, extra={"service": {"pipelines": {"default": {
        "receivers": ["cuda"], "processors": ["cuda"]}}}})
    return Agent(cfg, target_pids=[pid])


def test_compiler_pages_are_dropped_after_start_and_fault_back_for_the_next_compile(bpf_ready, tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"])
    first = second = None
    try:
        first = _agent(sleeper.pid, str(tmp_path / "a"))
        first.start()
        # ~83 MiB without the release (LLVM 14); what stays is its data and relocated tables
        assert _llvm_rss() < 24 * 2**20, "clang/LLVM code pages still resident after start"
        second = _agent(sleeper.pid, str(tmp_path / "b"))
        second.start()  # compiles again: the dropped pages come back from the page cache
        assert second.receivers["cuda"].bpf is not None
    finally:
        for a in (second, first):
            if a is not None:
                a.shutdown()
        sleeper.kill()
        sleeper.wait()
