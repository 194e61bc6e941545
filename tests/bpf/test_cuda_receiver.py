"""The CUDA receiver's real uprobes on real processes (tests/support/cuda_driver).

Against NVIDIA's libcudart.so.12 (no GPU here: every call returns 35, the probes still fire)
and against tests/bpf/stand_in_cudart.c, a libcudart.so.12 whose calls succeed, for what only
success shows (a committed cudaSetDevice, pointers written back, frees matching them), and
tests/bpf/cuda_ptsz.c for the per-thread-default-stream entry points. Every wait is bounded.
"""
from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.bpf.clock import CHECK_EVERY_NS, KernelClock
from otel_ebpf.core.events import LibraryLoaded, MetricRecord, ProcessExit
from otel_ebpf.core.pipeline import Context, ListConsumer
from otel_ebpf.processors.cuda import Config as ProcessorConfig
from otel_ebpf.processors.cuda import CudaProcessor
from otel_ebpf.receivers.cuda import Config, CudaReceiver, create
from otel_ebpf.bpf.receiver import _LIBOPEN
from otel_ebpf.receivers.cuda.receiver import PROBES
from otel_ebpf.receivers.cuda.events import (
    AllocCall,
    CallStats,
    FreeCall,
    GraphLaunchCall,
    KernelLaunch,
    KernelLaunchStats,
    MemcpyCall,
    SetDeviceCall,
    SyncCall,
)

pytestmark = pytest.mark.bpf

HERE = Path(__file__).resolve().parent
CALL_TYPES = (MemcpyCall, AllocCall, FreeCall, SyncCall, SetDeviceCall)
# cuda_driver's script, launches excluded (they are counted, not paired)
SCRIPT_CALLS = ["cudaSetDevice", "cudaMalloc", "cudaMallocManaged", "cudaMallocAsync", "cudaMemcpy",
                "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                "cudaEventSynchronize", "cudaFree", "cudaFreeAsync"]
STAND_IN_PTR_BASE, STAND_IN_PTR_STEP = 0x7F5A00000000, 0x100000


def build_c(tmp_path_factory: pytest.TempPathFactory, source: str, out_name: str, *flags: str,
            soname: str | None = None) -> Path:
    """tests/bpf/SOURCE built with gcc -O1 -g -Wall -Wextra -Werror: a program, or with ``soname`` a shared
    library (-fPIC -shared)."""
    out = tmp_path_factory.mktemp(Path(source).stem) / out_name
    lib = ["-fPIC", "-shared", f"-Wl,-soname,{soname}"] if soname else []
    subprocess.run(["gcc", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *lib, *flags, "-o", str(out),
                    str(HERE / source), *([] if soname else ["-ldl"])], check=True, capture_output=True, timeout=60)
    return out


@pytest.fixture(scope="module")
def stand_in_cudart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "stand_in_cudart.c", "libcudart.so.12", soname="libcudart.so.12")


@pytest.fixture(scope="module")
def cuda_ptsz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "cuda_ptsz.c", "cuda_ptsz")


@pytest.fixture(scope="module")
def cuda_counted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "cuda_counted.c", "cuda_counted")


def _wait_for(what: str, cond: Callable[[], bool], timeout: float = 10.0, step: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


def _inflight(t: Traced) -> int:
    return sum(1 for _ in t.receiver.bpf["inflight"].keys())


@dataclass
class Traced:
    proc: subprocess.Popen[str]
    receiver: CudaReceiver
    sink: ListConsumer
    ctx: Context
    stdout: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def events(self, *types: type) -> list[Any]:
        return [e for e in self.sink.events if getattr(e, "pid", None) == self.pid
                and (not types or isinstance(e, types))]

    def release(self, timeout: float = 30.0, lines: str = "go\n") -> str:
        """Let the driver run (``lines`` on its stdin), wait for it to exit and for its ProcessExit to be read."""
        self.stdout, _ = self.proc.communicate(lines, timeout=timeout)
        _wait_for(f"ProcessExit of {self.pid}", lambda: bool(self.events(ProcessExit)))
        return self.stdout

    def results(self) -> list[tuple[str, int]]:
        """(function, rc) per 'cudaX rc=N' line of the driver, in call order."""
        out = []
        for line in self.stdout.splitlines():
            name, _, rest = line.partition(" rc=")
            if rest:
                out.append((name, int(rest)))
        return out

    def printed(self, key: str) -> int:
        """A hex value the driver printed ('func=0x..', 'src=0x..')."""
        for word in self.stdout.split():
            if word.startswith(key + "="):
                return int(word.split("=", 1)[1], 16)
        raise AssertionError(f"driver printed no {key}= in {self.stdout!r}")


def _ready(proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "driver never printed 'ready'"
    line = proc.stdout.readline()
    assert line.startswith("ready pid="), line


@contextlib.contextmanager
def traced(argv: list[str], config: Config, *, wait_ready: bool = True,
           extra_pids: tuple[int, ...] = (), env: dict[str, str] | None = None,
           clock: KernelClock | None = None) -> Iterator[Traced]:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=None if env is None else {**os.environ, **env})
    receiver = None
    try:
        if wait_ready:
            _ready(proc)
        ctx = Context(target_pids=[proc.pid, *extra_pids], clock=clock)
        sink = ListConsumer()
        receiver = create(config, ctx, sink)
        receiver.start()
        yield Traced(proc, receiver, sink, ctx)
    finally:
        if receiver is not None:
            receiver.shutdown()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _assert_script(t: Traced, expect_rc: int, device: int) -> None:
    """Every scripted call decoded with its known arguments, device and the real rc."""
    results = t.results()
    assert [n for n, _ in results if "Launch" not in n] == SCRIPT_CALLS
    assert {rc for _, rc in results} == {expect_rc}
    calls = t.events(*CALL_TYPES)
    assert [c.api for c in calls] == SCRIPT_CALLS
    now = time.time_ns()
    for c in calls:
        assert c.rc == expect_rc, c
        assert now - 60e9 < c.start_ns <= c.end_ns <= now, c
    setdev, malloc, managed, masync, memcpy, mcasync, ssync, dsync, esync, free, fasync = calls
    assert isinstance(setdev, SetDeviceCall) and setdev.requested == 1
    assert all(c.device == device for c in calls), calls
    assert isinstance(malloc, AllocCall) and (malloc.size, malloc.stream, malloc.flags) == (1048576, 0, 0)
    assert isinstance(managed, AllocCall) and (managed.size, managed.flags) == (4096, 1)
    assert isinstance(masync, AllocCall) and (masync.size, masync.stream) == (8192, 0)
    src, dst = t.printed("src"), t.printed("dst")
    assert isinstance(memcpy, MemcpyCall) and (memcpy.dst, memcpy.src, memcpy.bytes, memcpy.kind) == (
        dst, src, 65536, 1)
    assert isinstance(mcasync, MemcpyCall) and (mcasync.dst, mcasync.src, mcasync.bytes, mcasync.kind,
                                                mcasync.stream) == (dst, src, 32768, 2, 0)
    assert all(isinstance(s, SyncCall) and s.handle == 0 for s in (ssync, dsync, esync))
    assert isinstance(free, FreeCall) and free.ptr == malloc.ptr
    assert isinstance(fasync, FreeCall) and (fasync.ptr, fasync.stream) == (masync.ptr, 0)
    # launches: counted per shape in the kernel, and sampled (launch_sample_every=1)
    stats = {(s.grid_size, s.block_size, s.device): s.count
             for s in t.events(KernelLaunchStats)}
    assert stats == {(7 * 3 * 2, 128 * 2 * 1, device): 1, (5, 64, device): 1}
    launch, launch_exc = t.events(KernelLaunch)
    func = t.printed("func")
    assert isinstance(launch, KernelLaunch) and isinstance(launch_exc, KernelLaunch)
    assert (launch.api, launch.func, launch.grid, launch.block, launch.shared_mem, launch.stream,
            launch.seq, launch.device) == ("cudaLaunchKernel", func, (7, 3, 2), (128, 2, 1), 256, 0, 1, device)
    assert (launch_exc.api, launch_exc.func, launch_exc.grid, launch_exc.block, launch_exc.shared_mem,
            launch_exc.stream, launch_exc.seq) == ("cudaLaunchKernelExC", func, (5, 1, 1), (64, 1, 1), 512, 0, 2)
    assert t.ctx.telemetry.get("otel_ebpf.events.dropped", receiver="cuda") == 0


def test_real_cudart_every_call_with_known_arguments_and_real_rc(bpf_ready: None, built: dict[str, Path],
                                                                 cudart: Path) -> None:
    argv = [str(built["cuda_driver"]), str(cudart), "--wait-stdin"]
    with traced(argv, Config(launch_sample_every=1)) as t:
        assert t.receiver.ctx.telemetry.get("otel_ebpf.probes.attached", library=cudart.name) >= 32
        t.release()
        t.receiver.shutdown()  # final read of the launch counters
        # 35 = cudaErrorInsufficientDriver: the failed cudaSetDevice binds nothing, so the thread stays on
        # CUDA's default device 0
        _assert_script(t, expect_rc=35, device=0)


def test_a_step_of_the_wall_clock_while_traced_moves_later_call_times_with_it(bpf_ready: None,
                                                                             built: dict[str, Path],
                                                                             cudart: Path) -> None:
    """The poll loop finds a step of the wall clock (here a wall clock 30 s ahead from a moment on, as after
    chrony's makestep) within a check interval, counts it once and stamps the calls made after it by the new wall
    clock, not the offset measured at start."""
    shift = [0]
    clock = KernelClock(wall=lambda: time.time_ns() + shift[0])
    argv = [str(built["cuda_driver"]), str(cudart), "--wait-stdin"]
    with traced(argv, Config(launch_sample_every=1), clock=clock) as t:
        shift[0] = 30_000_000_000
        _wait_for("the step counted", lambda: t.ctx.telemetry.get("otel_ebpf.clock.steps") == 1,
                  timeout=5 * CHECK_EVERY_NS / 1e9)
        before = time.time_ns() + shift[0]
        t.release()
        after = time.time_ns() + shift[0]
        calls = t.events(MemcpyCall)
        assert calls and all(before <= c.start_ns <= c.end_ns <= after for c in calls), (before, after, calls)
    assert t.ctx.telemetry.get("otel_ebpf.clock.steps") == 1


def test_successful_calls_bind_device_and_pair_pointers(bpf_ready: None, built: dict[str, Path],
                                                        stand_in_cudart: Path) -> None:
    argv = [str(built["cuda_driver"]), str(stand_in_cudart), "--wait-stdin"]
    with traced(argv, Config(launch_sample_every=1)) as t:
        t.release()
        t.receiver.shutdown()
        _assert_script(t, expect_rc=0, device=1)
        allocs = t.events(AllocCall)
        assert [a.ptr for a in allocs] == [
            STAND_IN_PTR_BASE + i * STAND_IN_PTR_STEP for i in range(3)]
        # through the processor: cudaMallocManaged's 4096 bytes on device 1 leak at exit
        out = ListConsumer()
        CudaProcessor(ProcessorConfig(), Context(), out).consume(t.sink.take())
        leaked = {m.name: (m.value, dict(m.attributes)) for m in out.events
                  if isinstance(m, MetricRecord) and m.name.startswith("gpu.cuda.memory.leaked")}
        assert leaked == {"gpu.cuda.memory.leaked": (4096, {"cuda.device.index": 1}),
                          "gpu.cuda.memory.leaked.allocations": (1, {"cuda.device.index": 1})}


def test_per_thread_stream_variants_are_traced_as_themselves(bpf_ready: None, cuda_ptsz: Path,
                                                             cudart: Path) -> None:
    with traced([str(cuda_ptsz), str(cudart)], Config(launch_sample_every=1)) as t:
        t.release()
        t.receiver.shutdown()
        assert {rc for _, rc in t.results()} == {35} and len(t.results()) == 7
        src, dst = t.printed("src"), t.printed("dst")
        masync, mcpy, mcasync, ssync, fasync = t.events(*CALL_TYPES)
        assert (masync.api, masync.size, masync.stream, masync.rc) == ("cudaMallocAsync_ptsz", 12288, 0x51, 35)
        assert (mcpy.api, mcpy.dst, mcpy.src, mcpy.bytes, mcpy.kind, mcpy.stream) == (
            "cudaMemcpy_ptds", dst, src, 1024, 1, 0)
        assert (mcasync.api, mcasync.bytes, mcasync.kind, mcasync.stream) == ("cudaMemcpyAsync_ptsz", 2048, 3, 0x52)
        assert (ssync.api, ssync.handle) == ("cudaStreamSynchronize_ptsz", 0x55)
        assert (fasync.api, fasync.ptr, fasync.stream) == ("cudaFreeAsync_ptsz", 0, 0x56)
        func = t.printed("func")
        assert [(k.api, k.func, k.grid, k.block, k.shared_mem, k.stream) for k in t.events(KernelLaunch)] == [
            ("cudaLaunchKernel_ptsz", func, (3, 2, 1), (32, 4, 2), 128, 0x53),
            ("cudaLaunchKernelExC_ptsz", func, (9, 1, 1), (16, 16, 1), 64, 0x54)]
        assert {(s.grid_size, s.block_size): s.count for s in t.events(KernelLaunchStats)} == {
            (6, 256): 1, (9, 256): 1}


def test_library_opened_after_start_is_caught_before_first_call(bpf_ready: None, built: dict[str, Path],
                                                                 cudart: Path) -> None:
    # sh waits for our go, then execs the driver (same pid), which sleeps, then dlopens:
    # the library is neither mapped nor configured when the receiver starts.
    argv = ["/bin/sh", "-c", 'read _ && exec "$0" "$@"', str(built["cuda_driver"]), str(cudart),
            "--delay-before-dlopen-ms", "100"]
    with traced(argv, Config(pause_on_load=True), wait_ready=False) as t:
        assert t.ctx.libraries == {}
        assert t.ctx.telemetry.get("otel_ebpf.probes.attached", library=cudart.name) == 0
        t.release()
        t.receiver.shutdown()
        loaded = t.events(LibraryLoaded)
        assert loaded and loaded[0].path.endswith("libcudart.so.12")
        assert t.ctx.telemetry.get("otel_ebpf.probes.attached", library=cudart.name) >= 32
        _assert_script_calls_only(t)


def _assert_script_calls_only(t: Traced) -> None:
    calls = t.events(*CALL_TYPES)
    assert [c.api for c in calls] == SCRIPT_CALLS
    assert [c.rc for c in calls] == [rc for n, rc in t.results() if "Launch" not in n]

    def launches() -> int:
        return sum(s.count for s in t.events(KernelLaunchStats))

    _wait_for("the next read of the launch counters", lambda: launches() >= 2)
    assert launches() == 2


def test_launch_counts_are_exact(bpf_ready: None, built: dict[str, Path], cudart: Path) -> None:
    loops = 10000
    argv = [str(built["cuda_driver"]), str(cudart), "--launch-only", "--loops", str(loops), "--wait-stdin"]
    config = Config(stats_interval=0.01, poll_interval=0.005)
    with traced(argv, config) as t:
        t.release()
        # the driver is reaped: the next read is its final one and deletes its counters
        _wait_for("launch counters of the exited driver deleted",
                  lambda: not any(k.pid == t.pid for k in t.receiver.bpf["launch_stats"].keys()))
        stats = t.events(KernelLaunchStats)
        assert {(s.grid_size, s.block_size) for s in stats} == {(42, 256)}
        assert sum(s.count for s in stats) == loops
        assert t.ctx.telemetry.get("otel_ebpf.events.dropped", receiver="cuda") == 0
        assert "ns_per_call=" in t.stdout


def test_process_exiting_inside_a_call_keeps_earlier_events(bpf_ready: None, built: dict[str, Path],
                                                            cudart: Path) -> None:
    driver = str(built["cuda_driver"])
    dying = subprocess.Popen([driver, str(cudart), "--exit-mid-call", "--wait-stdin"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        _ready(dying)
        with traced([driver, str(cudart), "--wait-stdin"], Config(), extra_pids=(dying.pid,)) as t:
            t.release()  # earlier events: a full script
            before = list(t.events())
            assert dying.stdin is not None
            dying.stdin.write("go\n")
            dying.stdin.flush()
            _wait_for("the dying driver's call in flight", lambda: _inflight(t) > 0, timeout=5, step=0.002)
            out, _ = dying.communicate(timeout=30)
            assert dying.returncode == 3 and "in_call=1" in out, out
            _wait_for("ProcessExit of the dying driver",
                      lambda: any(isinstance(e, ProcessExit) and e.pid == dying.pid for e in t.sink.events))
            # it ran the script (completed calls, all kept), then its worker thread died between
            # the uprobe and the uretprobe of cudaDeviceSynchronize: no record for that call, and
            # the thread-exit hook removed its in-flight entry
            dying_calls = [e for e in t.sink.events if getattr(e, "pid", None) == dying.pid
                           and isinstance(e, CALL_TYPES)]
            assert [c.api for c in dying_calls] == SCRIPT_CALLS
            assert all(c.tid == dying.pid for c in dying_calls)  # none from the worker thread
            _wait_for("the thread-exit hook to clear in-flight calls", lambda: _inflight(t) == 0)
            assert t.events() == before
            _assert_script_calls_only(t)
            assert t.ctx.telemetry.get("otel_ebpf.events.dropped", receiver="cuda") == 0
    finally:
        if dying.poll() is None:
            dying.kill()
            dying.wait(timeout=10)


LIMITED_APIS = ("cudaMemcpy", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                "cudaEventSynchronize")


def _call_stats(t: Traced) -> dict[str, list[CallStats]]:
    out: dict[str, list[CallStats]] = {}
    for s in t.events(CallStats):
        out.setdefault(s.api, []).append(s)
    return out


def test_span_rate_limit_keeps_every_call_counted_in_the_kernel(bpf_ready: None, built: dict[str, Path],
                                                                 cudart: Path) -> None:
    """3,000 runs of the script on the real libcudart under a 100 spans/s budget: memcpy and
    synchronize calls get at most the budget's records, every one of them is still counted
    (calls, bytes, histogram buckets, limited), and allocations/frees all keep their records."""
    loops, rate = 3000, 100
    argv = [str(built["cuda_driver"]), str(cudart), "--loops", str(loops), "--wait-stdin"]
    config = Config(span_rate_limit=rate, always_span_slower_than=0, stats_interval=0.05)
    with traced(argv, config) as t:
        t0 = time.monotonic()
        t.release(timeout=120)
        elapsed = time.monotonic() - t0
        t.receiver.shutdown()  # final read of the counters
        records = [c for c in t.events(MemcpyCall, SyncCall)]
        # the bucket starts full (one second's worth) and refills at `rate`/s while the script runs
        assert rate <= len(records) <= rate + rate * elapsed + 5, (len(records), elapsed)
        stats = _call_stats(t)
        assert set(stats) == set(LIMITED_APIS)
        for api, rows in stats.items():
            assert sum(s.calls for s in rows) == loops, api
            assert {(s.rc, s.device) for s in rows} == {(35, 0)}  # no device set: CUDA's default, 0
            assert sum(sum(s.dur_hist) for s in rows) == loops
            assert sum(s.dur_ns for s in rows) > 0
            if "Memcpy" in api:
                nbytes = 65536 if api == "cudaMemcpy" else 32768
                assert sum(s.bytes for s in rows) == loops * nbytes
                assert sum(sum(s.bytes_hist) for s in rows) == loops
                assert {s.kind for s in rows} == {1 if api == "cudaMemcpy" else 2}
            else:
                assert sum(s.bytes for s in rows) == 0 and not any(any(s.bytes_hist) for s in rows)
        limited = sum(s.limited for rows in stats.values() for s in rows)
        assert limited == len(LIMITED_APIS) * loops - len(records)
        # allocations, frees and cudaSetDevice are never limited: the allocation table needs them
        assert len(t.events(AllocCall)) == 3 * loops and len(t.events(FreeCall)) == 2 * loops
        assert len(t.events(SetDeviceCall)) == loops
        assert t.ctx.telemetry.get("otel_ebpf.events.dropped", receiver="cuda") == 0


def test_slow_calls_get_a_span_over_the_rate_limit(bpf_ready: None, built: dict[str, Path], cudart: Path) -> None:
    loops = 3
    argv = [str(built["cuda_driver"]), str(cudart), "--loops", str(loops), "--sleep-in-call-ms", "3",
            "--wait-stdin"]
    # 1 span/s: after the first call the budget is empty for the rest of this ~0.1 s run
    with traced(argv, Config(span_rate_limit=1, always_span_slower_than=0.002)) as t:
        t.release(timeout=60)
        t.receiver.shutdown()
        records = t.events(MemcpyCall, SyncCall)
        assert len(records) == len(LIMITED_APIS) * loops
        assert all(r.end_ns - r.start_ns >= 2_000_000 for r in records)
        assert sum(s.limited for rows in _call_stats(t).values() for s in rows) == 0


def test_no_rate_limit_gives_every_call_a_record(bpf_ready: None, built: dict[str, Path], cudart: Path) -> None:
    loops = 1000
    argv = [str(built["cuda_driver"]), str(cudart), "--loops", str(loops), "--wait-stdin"]
    with traced(argv, Config(span_rate_limit=0)) as t:
        t.release(timeout=120)
        t.receiver.shutdown()
        assert len(t.events(MemcpyCall, SyncCall)) == len(LIMITED_APIS) * loops
        stats = _call_stats(t)
        assert {api: sum(s.calls for s in rows) for api, rows in stats.items()} == dict.fromkeys(LIMITED_APIS, loops)
        assert sum(s.limited for rows in stats.values() for s in rows) == 0


def test_loader_candidates_that_do_not_exist_are_not_attached(bpf_ready: None, built: dict[str, Path],
                                                             cudart: Path, tmp_path: Path) -> None:
    # dlopen by name with a directory lacking the library first on LD_LIBRARY_PATH (as libtorch's $ORIGIN
    # RPATH, torch/lib, lacks libcudart): the loader's openat of <dir>/libcudart.so.12 is seen (and fails)
    # before the real one's; only the real one is a library.
    missing = tmp_path / "lacks-cudart"
    missing.mkdir()
    argv = ["/usr/bin/env", f"LD_LIBRARY_PATH={missing}:{cudart.parent}", "/bin/sh", "-c",
            'read _ && exec "$0" "$@"', str(built["cuda_driver"]), cudart.name, "--delay-before-dlopen-ms", "100"]
    with traced(argv, Config(pause_on_load=True), wait_ready=False) as t:
        reported: list[str] = []  # every library-open record the kernel sent (each one a stop)
        opened = t.receiver._library_opened

        def spy(raw: bytes) -> LibraryLoaded | None:
            reported.append(_LIBOPEN.unpack_from(raw)[-1].split(b"\0", 1)[0].decode())
            return opened(raw)

        t.receiver._library_opened = spy  # type: ignore[method-assign]
        t.release()
        t.receiver.shutdown()
        loaded = [e.path for e in t.events(LibraryLoaded)]
        assert loaded and all(not p.startswith(str(missing)) for p in loaded), loaded
        # only opens that succeeded are reported (and stopped for): not the failed candidate, nor the
        # ~30 places libcudart 12 looks for a libcuda.so.1 that this host does not have
        assert reported == loaded, reported
        assert t.ctx.telemetry.get("otel_ebpf.probes.failed", library=cudart.name) == 0
        assert t.ctx.telemetry.get("otel_ebpf.probes.attached", library=cudart.name) >= 32


def test_attach_is_one_line_per_library_a_warning_only_when_a_needed_symbol_is_missing(
        bpf_ready: None, stand_in_cudart: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # a libcudart with two of the probed functions only: one WARNING for the library, naming what is missing;
    # the stand-in lacks only the optional per-thread-stream variants: one INFO line that names them
    src, lib = tmp_path / "partial.c", tmp_path / "libcudart.so.13"
    src.write_text("int cudaMalloc(void **p, unsigned long n) { (void)p; (void)n; return 0; }\n"
                   "int cudaFree(void *p) { (void)p; return 0; }\n")
    subprocess.run(["gcc", "-O1", "-fPIC", "-shared", "-o", str(lib), str(src)], check=True, capture_output=True,
                   timeout=60)
    ctx = Context(target_pids=[1])
    receiver = create(Config(libraries=[str(lib), str(stand_in_cudart)]), ctx, ListConsumer())
    with caplog.at_level("INFO", logger="otel_ebpf.bpf.receiver"):
        try:
            receiver.start()
        finally:
            receiver.shutdown()
    (partial,) = [r for r in caplog.records if str(lib) in r.getMessage()]
    message = partial.getMessage()
    assert partial.levelname == "WARNING" and message.startswith(f"cuda: attached 4 of {2 * len(PROBES) - 4} probes")
    assert "needed could not attach: " in message and "cudaMemcpy (not in the library)" in message
    assert "cudaMalloc " not in message
    assert ctx.telemetry.get("otel_ebpf.probes.failed", library=lib.name) >= 10
    (full,) = [r for r in caplog.records if str(stand_in_cudart) in r.getMessage()]
    assert full.levelname == "INFO" and "optional, absent: cudaLaunchKernel_ptsz (not in the library)" in \
        full.getMessage()
    assert ctx.telemetry.get("otel_ebpf.probes.failed", library=stand_in_cudart.name) == 0


@pytest.fixture(scope="module")
def cuda_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cuda_graph") / "cuda_graph"
    subprocess.run(["gcc", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(HERE / "cuda_graph.c"),
                    "-ldl"], check=True, capture_output=True, timeout=60)
    return out


@pytest.mark.parametrize("which", ["real", "stand_in"])
def test_graph_replays_are_calls_with_their_exec_and_stream_and_are_all_counted(
        bpf_ready: None, cuda_graph: Path, cudart: Path, stand_in_cudart: Path, which: str) -> None:
    lib, replays = cudart if which == "real" else stand_in_cudart, 5
    with traced([str(cuda_graph), str(lib), str(replays)], Config(span_rate_limit=2, always_span_slower_than=0,
                                                                    stats_interval=0.05)) as t:
        t.release()
        t.receiver.shutdown()  # final read of the counters
        rcs = {rc for _, rc in t.results()}
        assert len(t.results()) == replays and rcs == {35 if which == "real" else 0}
        calls = t.events(GraphLaunchCall)
        # spans within the budget (a full bucket of 2 per second), each with its own exec handle
        assert 1 <= len(calls) <= replays
        assert [c.exec for c in calls] == [0x6000 + i for i in range(len(calls))]
        assert all(c.api == "cudaGraphLaunch" and c.stream == 0x77 and c.rc in rcs and c.device == 0 for c in calls)
        # every replay counted in the kernel, over the span budget too
        stats = [s for s in t.events(CallStats) if s.api == "cudaGraphLaunch"]
        assert sum(s.calls for s in stats) == replays
        assert sum(s.limited for s in stats) == replays - len(calls)


@pytest.mark.parametrize("which", ["stand_in", "real"])
def test_counted_calls_are_counted_exactly_with_their_bytes(bpf_ready: None, cuda_counted: Path,
                                                             stand_in_cudart: Path, cudart: Path, which: str) -> None:
    """cuda_counted's script (tests/bpf/cuda_counted.c): every memset, event, stream and host-register call
    counted once in the kernel; memset and host-register bytes only when the call succeeded (the stand-in);
    the real libcudart returns 35 from each: the same counts, no bytes. No record, so no span."""
    lib = stand_in_cudart if which == "stand_in" else cudart
    with traced([str(cuda_counted), str(lib)], Config()) as t:
        t.release()
        t.receiver.shutdown()
        rc = 0 if which == "stand_in" else 35
        assert {r for _, r in t.results()} == {rc} and len(t.results()) == 13
        stats = {(c.api, c.rc): c for c in t.events(CallStats)}
        calls = {api: c.calls for (api, _), c in stats.items()}
        assert calls == {"cudaStreamCreateWithPriority": 1, "cudaEventCreateWithFlags": 1, "cudaMemsetAsync": 3,
                         "cudaMemset": 1, "cudaEventRecord": 2, "cudaStreamWaitEvent": 1, "cudaHostRegister": 1,
                         "cudaHostUnregister": 1, "cudaEventDestroy": 1, "cudaStreamDestroy": 1}, calls
        assert {r for _, r in stats} == {rc}
        expect_bytes = {"cudaMemsetAsync": 3 * 4096, "cudaMemset": 65536, "cudaHostRegister": 1 << 20}
        got = {api: c.bytes for (api, _), c in stats.items() if c.bytes}
        assert got == (expect_bytes if rc == 0 else {}), got
        assert all(sum(c.dur_hist) == c.calls for c in stats.values())
        assert not t.events(*CALL_TYPES)  # counted only: no record
