"""The memory receiver's real tracepoints on processes the test starts: page faults of a child
touching N fresh pages, its RSS from /proc, and an OOM kill inside a memory cgroup the test
creates (cgroup v2 memory.max, or v1 memory.limit_in_bytes; removed afterwards). Every wait is
bounded."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from otel_ebpf.core.events import MetricRecord, ProcessExit, SpanRecord
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.memory import Config as ProcessorConfig
from otel_ebpf.processors.memory import MemoryProcessor
from otel_ebpf.receivers.memory import Config, create
from otel_ebpf.receivers.memory.events import MemoryUsage, OomKill, PageFaults

pytestmark = pytest.mark.bpf

PAGES = 2000
TOUCH = f"""
import mmap, resource, sys
sys.stdin.readline()
m = mmap.mmap(-1, {PAGES} * mmap.PAGESIZE)
for i in range(0, {PAGES} * mmap.PAGESIZE, mmap.PAGESIZE):
    m[i] = 1
print("touched", flush=True)
sys.stdin.readline()
ru = resource.getrusage(resource.RUSAGE_SELF)
print(ru.ru_minflt + ru.ru_majflt, flush=True)
"""
HOG = """
import sys
sys.stdin.readline()
chunks = []
for _ in range(256):
    chunks.append(bytearray(1 << 20))  # zero-filled: every page is touched
print("survived", flush=True)
"""


def _wait_for(what: str, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def _traced(script: str,
            fault_tracepoint: bool = True) -> Iterator[tuple[subprocess.Popen[str], ListConsumer, Context]]:
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    receiver = None
    try:
        ctx = Context(target_pids=[proc.pid])
        sink = ListConsumer()
        # fault_source 'proc' is also the path of kernels without exceptions:page_fault_user
        receiver = create(Config(interval=0.1, fault_source="tracepoint" if fault_tracepoint else "proc"),
                          ctx, sink)
        receiver.start()
        yield proc, sink, ctx
    finally:
        if receiver is not None:
            receiver.shutdown()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.mark.parametrize("tracepoint", [True, False], ids=["tracepoint", "proc_stat_fallback"])
def test_faults_of_a_child_touching_n_pages_are_counted(bpf_ready: None, tracepoint: bool) -> None:
    with _traced(TOUCH, tracepoint) as (proc, sink, _ctx):
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "touched"

        def faults() -> int:
            return sum(e.count for e in sink.events if isinstance(e, PageFaults) and e.pid == proc.pid)

        _wait_for(f">= {PAGES} faults", lambda: faults() >= PAGES)
        usage = [e for e in sink.events if isinstance(e, MemoryUsage) and e.pid == proc.pid]
        assert usage, "no RSS sample of the traced child"
        _wait_for("an RSS sample with the touched pages", lambda: any(
            e.rss >= PAGES * os.sysconf("SC_PAGE_SIZE") for e in sink.events
            if isinstance(e, MemoryUsage) and e.pid == proc.pid))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        kernel_total = int(proc.stdout.readline())
        proc.wait(timeout=10)
        _wait_for("its exit", lambda: any(isinstance(e, ProcessExit) and e.pid == proc.pid for e in sink.events))
        # never more than the kernel's own count for the whole process life (getrusage)
        assert PAGES <= faults() <= kernel_total + 50
    # an untraced process is not counted
    assert all(e.pid == proc.pid for e in sink.events if isinstance(e, PageFaults))


class MemCgroup:
    """A memory-limited cgroup under the test's own one (v2 or v1), removed on exit."""

    def __init__(self, limit: int) -> None:
        self.path = self._make(f"oe-test-{uuid.uuid4().hex[:8]}")
        files = (("memory.max", "memory.swap.max") if self.v2
                 else ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"))
        (self.path / files[0]).write_text(str(limit))
        swap = self.path / files[1]
        if swap.exists():
            swap.write_text("0" if self.v2 else str(limit))

    def _make(self, name: str) -> Path:
        root = Path("/sys/fs/cgroup")
        own = {line.split(":", 2)[1]: line.split(":", 2)[2].strip()
               for line in Path("/proc/self/cgroup").read_text().splitlines()}
        self.v2 = "memory" in (root / "cgroup.controllers").read_text().split() \
            if (root / "cgroup.controllers").exists() else False
        if self.v2:
            parent = root / own[""].lstrip("/")
            if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                pytest.skip(f"memory controller not enabled for children of {parent}")
        elif (root / "memory").is_dir():
            parent = root / "memory" / own.get("memory", "/").lstrip("/")
        else:
            pytest.skip("no cgroup memory controller (neither v2 nor v1) on this host")
        path = parent / name
        path.mkdir()
        return path

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def test_oom_kill_in_a_memory_cgroup_names_the_victim(bpf_ready: None) -> None:
    cg = MemCgroup(64 << 20)
    try:
        with _traced(HOG) as (proc, sink, ctx):
            assert proc.stdin is not None
            cg.add(proc.pid)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            proc.wait(timeout=60)
            assert proc.returncode == -9, f"the hog was not OOM-killed (rc {proc.returncode})"
            _wait_for("the OOM record", lambda: any(isinstance(e, OomKill) for e in sink.events))
            ooms = [e for e in sink.events if isinstance(e, OomKill)]
            assert [e.pid for e in ooms] == [proc.pid]
            oom = ooms[0]
            assert oom.comm.startswith("python")
            assert oom.trigger_pid == proc.pid
            assert 32 << 20 <= oom.anon_rss <= 80 << 20, oom  # at the 64 MiB limit
            # the processor turns it into a span on the victim's resource, and a counter
            out = ListConsumer()
            MemoryProcessor(ProcessorConfig(), ctx, out).consume([oom])
            span = next(e for e in out.events if isinstance(e, SpanRecord))
            assert (span.pid, span.name, span.error) == (proc.pid, "process.oom_kill", "oom_kill")
            assert span.attributes["process.pid"] == proc.pid
            assert span.attributes["process.oom.anon_rss"] == oom.anon_rss
            assert any(isinstance(e, MetricRecord) and e.name == "process.oom_kills" for e in out.events)
    finally:
        cg.remove()
